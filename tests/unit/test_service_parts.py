"""The service layer's small parts: the instrumented store, the recovery loop, the HTTP side."""

from __future__ import annotations

import asyncio
import inspect
import random
from typing import Any

import pytest
from prometheus_client import generate_latest

from backends.memory import open_memory_backend
from service.domain.committer import MessageCommitter
from service.domain.model import RecoveryReport, RecoveryStats
from service.domain.ports import ManualClock, MessageStore
from service.health import Readiness
from service.httpside import HttpSide
from service.metrics import InstrumentedStore, ServiceMetrics, instrument
from service.recovery import RecoveryLoop
from tests.support import NO_QUOTA, send


def test_the_instrumented_store_overrides_every_store_method() -> None:
    public = {
        name
        for name, member in inspect.getmembers(MessageStore, inspect.isfunction)
        if not name.startswith("__")
    }
    overridden = {name for name in public if name in vars(InstrumentedStore)}
    assert overridden == public


async def test_the_instrumented_store_times_calls_and_keeps_atomicity() -> None:
    backend = open_memory_backend()
    metrics = ServiceMetrics()
    store = instrument(backend.store, metrics)
    assert store.atomic_publish_commit is backend.store.atomic_publish_commit is True
    committer = MessageCommitter(
        store, backend.membership, backend.outbox, limits=NO_QUOTA, observer=metrics
    )
    await backend.membership.create_conversation("t1", "c1", ["alice"])
    ack = await committer.commit_send(send("t1", cmid="m-1"))
    assert await committer.commit_send(send("t1", cmid="m-1")) == ack
    text = generate_latest(metrics.registry).decode()
    assert 'message_committer_backend_operation_seconds_count{operation="reserve"} 2.0' in text
    assert 'message_committer_commits_total{outcome="committed"} 1.0' in text
    assert 'message_committer_commits_total{outcome="replayed"} 1.0' in text


class _FakeQueue:
    """The recovery queue as the loop sees it: ``pending`` due items of which
    ``failing`` (the oldest) fail, and are then pushed back (not due again this run)."""

    def __init__(self, pending: int, failing: int = 0) -> None:
        self.pending = pending
        self.failing = failing
        self.calls: list[tuple[int, int]] = []

    async def recover_due(self, older_than_ms: int, max_items: int) -> RecoveryReport:
        self.calls.append((older_than_ms, max_items))
        scanned = min(self.pending, max_items)
        failed = min(self.failing, scanned)
        self.failing -= failed
        self.pending -= scanned
        return RecoveryReport(scanned, scanned - failed, failed, 0)

    async def recovery_stats(self) -> RecoveryStats:
        return RecoveryStats(None, 0)


def _loop(queue: _FakeQueue, clock: ManualClock | None = None, **kwargs: Any) -> RecoveryLoop:
    options: dict[str, Any] = {"interval_s": 10, "grace_s": 30, "batch": 10, **kwargs}
    return RecoveryLoop(queue, queue, ServiceMetrics(), clock or ManualClock(), **options)


async def test_a_recovery_run_takes_batches_until_one_scans_short() -> None:
    fake = _FakeQueue(pending=25)
    clock = ManualClock()
    report = await _loop(fake, clock).run_once()
    assert (report.scanned, report.committed) == (25, 25)
    assert fake.calls == [(clock.now - 30_000, 10)] * 3


async def test_failing_intents_do_not_end_a_run_early() -> None:
    # Release 1 stopped when fewer were *committed* than a batch: one failing intent,
    # oldest first, ended every run after its first batch.
    fake = _FakeQueue(pending=150, failing=1)
    report = await _loop(fake, batch=100).run_once()
    assert (report.committed, report.failed) == (149, 1)


async def test_a_recovery_run_is_bounded() -> None:
    fake = _FakeQueue(pending=10_000)
    report = await _loop(fake, grace_s=0, max_batches=4).run_once()
    assert report.committed == 40


def test_recovery_is_jittered_within_20_percent() -> None:
    loop = _loop(_FakeQueue(0), batch=1, rng=random.Random(7))
    delays = [loop.next_delay() for _ in range(200)]
    assert 8.0 <= min(delays) < max(delays) <= 12.0


async def test_the_recovery_loop_stops_when_told() -> None:
    loop = _loop(_FakeQueue(0), interval_s=0.01, grace_s=0, batch=1)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 1.0)


def test_http_routes() -> None:
    side = HttpSide(
        ServiceMetrics().registry, lambda: Readiness(False, "redis backend not ready (X)")
    )
    assert side.route("GET", "/healthz")[0] == 200
    assert side.route("GET", "/readyz")[0] == 503
    assert side.route("GET", "/readyz")[2] == b"redis backend not ready (X)\n"
    assert side.route("GET", "/metrics?x=1")[0] == 200
    assert side.route("POST", "/metrics")[0] == 405
    assert side.route("GET", "/")[0] == 404


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n"),
        (b"garbage\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n"),
        (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n", b""),  # oversized head: dropped
    ],
)
async def test_http_side_over_a_socket(request_bytes: bytes, expected: bytes) -> None:
    side = HttpSide(ServiceMetrics().registry, lambda: Readiness(True, "ready"))
    port = await side.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(expected)
    finally:
        await side.close()
