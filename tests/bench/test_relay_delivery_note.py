"""The bench's note of the in-server relay's delivery latency: the bucket bounds
of ``message_committer_relay_delivery_seconds`` that hold p50, p90 and p99."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from service.metrics import ServiceMetrics
from service.relay_metrics import RelayMetrics
from toolkit.bench.environment import Target
from toolkit.bench.runner import relay_delivery_note


def _target(metrics: ServiceMetrics, relay: object | None) -> Target:
    server = cast(Any, SimpleNamespace(metrics=metrics, relay=relay))
    return Target(backend="memory", address="127.0.0.1:1", description="test", server=server)


def test_the_note_gives_the_buckets_that_hold_the_quantiles() -> None:
    metrics = ServiceMetrics()
    relay = RelayMetrics(metrics.registry)
    for seconds in [0.004] * 60 + [0.02] * 35 + [0.7] * 5:
        relay.delivery_seconds.observe(seconds)
    note = relay_delivery_note(_target(metrics, relay=object()))
    assert "p50 <= 5 ms, p90 <= 25 ms, p99 <= 1000 ms (100 entries)" in note


def test_no_note_without_an_in_server_relay_or_deliveries() -> None:
    metrics = ServiceMetrics()
    RelayMetrics(metrics.registry)
    assert relay_delivery_note(_target(metrics, relay=object())) == ""
    assert relay_delivery_note(_target(metrics, relay=None)) == ""
