"""The bench's note of the in-server relay's delivery latency: the bucket bounds
of ``message_committer_relay_delivery_seconds`` that hold p50, p90 and p99, over
the gRPC phases only (the deliveries between two readings, summed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from service.metrics import ServiceMetrics
from service.relay_metrics import RelayMetrics
from toolkit.bench.environment import Target
from toolkit.bench.runner import _summed, delivery_buckets, relay_delivery_note


def _target(metrics: ServiceMetrics, relay: object | None) -> Target:
    server = cast(Any, SimpleNamespace(metrics=metrics, relay=relay))
    return Target(backend="memory", address="127.0.0.1:1", description="test", server=server)


def test_the_note_gives_the_buckets_that_hold_the_quantiles_of_the_phases_it_summed() -> None:
    metrics = ServiceMetrics()
    relay = RelayMetrics(metrics.registry)
    target = _target(metrics, relay=object())
    summed: list[tuple[float, float]] = []
    for phase in range(2):  # two gRPC phases: 50 entries each
        before = delivery_buckets(target)
        for seconds in [0.004] * 30 + [0.02] * 17 + [0.7] * 3:
            relay.delivery_seconds.observe(seconds)
        summed = _summed(summed, before, delivery_buckets(target))
        for _ in range(1000 if phase == 0 else 0):  # a floor's backlog between them
            relay.delivery_seconds.observe(8.0)
    note = relay_delivery_note(summed)
    assert "p50 <= 5 ms, p90 <= 25 ms, p99 <= 1000 ms (100 entries)" in note


def test_no_note_without_an_in_server_relay_or_deliveries() -> None:
    metrics = ServiceMetrics()
    RelayMetrics(metrics.registry)
    assert delivery_buckets(_target(metrics, relay=None)) == []
    empty = delivery_buckets(_target(metrics, relay=object()))
    assert empty and relay_delivery_note(_summed([], empty, empty)) == ""
    assert relay_delivery_note([]) == ""
