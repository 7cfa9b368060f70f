"""Whether a Redis link exchanges scripts itself or leaves them to the driver's
traced calls: decided by redis-py's instrumentation, which is an optional extra."""

from __future__ import annotations

import sys
import types

import pytest

from backends.redis.exchange import INSTRUMENTATION, driver_traced


def test_without_the_instrumentation_imported_nothing_is_traced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, INSTRUMENTATION, raising=False)
    assert not driver_traced()
    assert INSTRUMENTATION not in sys.modules  # asking did not import the extra


@pytest.mark.parametrize("on", [True, False])
def test_the_instrumentors_own_state_decides(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    class Instrumentor:
        is_instrumented_by_opentelemetry = on

    module = types.ModuleType(INSTRUMENTATION)
    module.RedisInstrumentor = Instrumentor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, INSTRUMENTATION, module)
    assert driver_traced() is on
