"""When tracing is on, and the start-up errors that stop a half-configured one.

(What a trace holds and what is scrubbed is checked on real spans by
tests/e2e/test_tracing.py; this is the environment logic alone.)
"""

from __future__ import annotations

import pytest

from service.config import ConfigError
from service.tracing import OFF, from_environment, wanted

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ],
)
def test_only_an_endpoint_turns_tracing_on(env: dict[str, str], on: bool) -> None:
    assert wanted(env) is on


def test_without_an_endpoint_the_hooks_cost_nothing() -> None:
    tracing = from_environment({})
    assert tracing is OFF and not tracing.enabled
    assert tracing.store_span("memory") is None
    assert tracing.server_interceptors() == []
    assert tracing.trace_ids() is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER must be otlp or none"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "only grpc is supported"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "only grpc is supported"),
    ],
)
def test_a_setting_that_cannot_be_honoured_stops_start_up(
    extra: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        from_environment({**ENDPOINT, **extra})
    assert caught.value.exit_code == 2
    assert "127.0.0.1:4317" not in str(caught.value)
