"""The fail-closed gate's rule (service.api.gate): which probe outcomes close it."""

from __future__ import annotations

import pytest

from service.api.errors import FailClosed, to_status
from service.api.gate import WriteGate
from service.domain.errors import StoreMisconfigured, StoreUnavailable, StoreWiped


def test_fail_closed_causes_close_the_gate_and_only_a_success_opens_it() -> None:
    gate = WriteGate()
    gate.check()  # open at first: the start-up probe must pass before serving
    gate.observe(StoreUnavailable("x"), "redis backend not ready (StoreUnavailable)")
    gate.check()  # an outage alone does not close it (the write fails on its own)
    gate.observe(StoreWiped("x"), "redis backend not ready (StoreWiped: restore it)")
    with pytest.raises(FailClosed, match="StoreWiped: restore it"):
        gate.check()
    gate.observe(StoreUnavailable("x"), "timeout")  # unknown: stays closed
    with pytest.raises(FailClosed, match="StoreWiped"):
        gate.check()
    gate.observe(None, "")
    gate.check()
    gate.observe(StoreMisconfigured("x", "fix NTP"), "scylla backend not ready (fix NTP)")
    with pytest.raises(FailClosed) as refused:
        gate.check()
    status = to_status(refused.value)
    assert status.code.name == "UNAVAILABLE" and "fix NTP" in status.details
