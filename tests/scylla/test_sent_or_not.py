"""Errors mapped by whether the request was sent (``session._translate``,
``session._applied``), with no server: the driver's own exception objects.

Never sent: another host, or a definite refusal (StoreUnavailable, nothing
applied). Sent without a usable answer: StoreOutcomeUnknown for a conditional
write, which the store then re-reads serially.
"""

from __future__ import annotations

import pytest
from cassandra import OperationTimedOut, WriteTimeout
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException, ConnectionShutdown

from backends.scylla.session import _applied, _translate
from service.domain.errors import StoreOutcomeUnknown, StoreUnavailable


@pytest.mark.parametrize(
    "rows", [[], [{"v": 1}], [{"current": None}]], ids=["no-rows", "no-flag", "other-columns"]
)
def test_a_conditional_answer_without_an_applied_column_is_an_unknown_outcome(
    rows: list[dict[str, object]],
) -> None:
    """It was sent and answered, but the answer does not say whether it applied."""
    with pytest.raises(StoreOutcomeUnknown, match=r"no \[applied\] flag"):
        _applied(rows)
    assert _applied([{"[applied]": True}]) and not _applied([{"[applied]": False, "v": 2}])


def test_a_conditional_write_no_host_took_is_a_definite_refusal() -> None:
    """NoHostAvailable: the plan ran out before any host took it (the driver
    does not retry: FallthroughRetryPolicy), so nothing was sent."""
    never_sent = NoHostAvailable(
        "Unable to complete the operation against any hosts",
        {"h": ConnectionException("Pool is shutdown")},
    )
    for mode in ("cas", "write", "read"):
        error = _translate(never_sent, mode)
        assert type(error) is StoreUnavailable, (mode, error)
        assert "nothing was sent" in str(error)
    # A serial re-read decides an earlier unknown write: still unknown.
    assert isinstance(_translate(never_sent, "serial"), StoreOutcomeUnknown)


@pytest.mark.parametrize(
    "sent",
    [
        OperationTimedOut({"h": "Client request timeout"}),
        ConnectionShutdown("Connection to h was closed"),
        WriteTimeout("timeout", write_type=5),
    ],
    ids=["client-timeout", "connection-lost", "cas-write-timeout"],
)
def test_a_conditional_write_sent_without_a_usable_answer_is_an_unknown_outcome(
    sent: Exception,
) -> None:
    assert isinstance(_translate(sent, "cas"), StoreOutcomeUnknown)
