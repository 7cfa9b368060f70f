"""Runs the phases of one backend: warm-up, fresh-serial, then rounds of every phase.

Each round runs the gRPC floor, every workload and the in-process floors
back to back, so the phases of one round share the machine's load; the
report takes medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TextIO

from service.domain.limits import CommitLimits
from service.tasks import wait_event
from toolkit.bench import slope
from toolkit.bench.driver import BenchError, ClientPool, create_population, gc_seconds
from toolkit.bench.environment import Target
from toolkit.bench.floors import StorageDriver, ensure_population, lwt_floor_op, run_ops
from toolkit.bench.relayproc import RelayProcess
from toolkit.bench.report import BackendReport, Phase, Round
from toolkit.bench.workloads import DESCRIPTIONS, Job, Kind, Population

MAX_CALLS = 5_000_000
"""Count bound of one phase when ``--requests`` is not given."""
FLOOR_DESCRIPTIONS = {
    "storage-floor": "fresh commit through the store objects, no gRPC (same calls as the service)",
    "storage-replay": "replay through the store objects, as the committer asks the store",
    "committer-floor": "MessageCommitter.commit_send in-process: no gRPC, no metrics",
    "lwt-floor": "one INSERT ... IF NOT EXISTS per op through the backend's own CQL session",
}
SUSTAINED = "sustained"
SUSTAINED_TEXT = "--sustained new sends, relay delivering: last 10 % vs first 10 % of them"
CPU_SAMPLE_S = 0.2
"""How often the sustained phase samples the server's (and its relay's) CPU."""
SUSTAINED_LIMIT_S = 3600.0
"""Time bound of the sustained phase (it ends at its commit count)."""
SERIAL = "fresh-serial"
"""Fresh sends from one stream, once per backend: per-commit cost without contention."""


class Progress:
    """One status line on stderr: redrawn with \\r on a tty, else a line every 5 s."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._every = 0.25 if self._tty else 5.0
        self._label = ""
        self._duration = 0.0
        self._start = self._last = 0.0

    def begin(self, label: str, duration: float) -> None:
        self._label, self._duration = label, duration
        self._start = self._last = time.monotonic()

    def tick(self, calls: int) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            return
        self._last = now
        elapsed = now - self._start
        rate = calls / elapsed if elapsed > 0 else 0.0
        text = (
            f"{self._label}: {elapsed:5.1f}/{self._duration:.1f}s {calls:>9} calls {rate:>9.0f}/s"
        )
        if self._tty:
            self._stream.write("\r" + text.ljust(78))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def end(self) -> None:
        if self._tty:
            self._stream.write("\r" + " " * 78 + "\r")
            self._stream.flush()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def sample_until(
    stop: asyncio.Event,
    read: Callable[[], tuple[float, float]],
    cpu: list[tuple[float, float]],
    gc: list[tuple[float, float]],
    every_s: float = CPU_SAMPLE_S,
) -> None:
    """Append ``(time.time(), CPU seconds)`` and ``(time.time(), GC seconds)`` from
    ``read`` every ``every_s`` until ``stop``, and once more after it: the phase's
    last completions come after the last sample otherwise, and its last tenth has no
    CPU figure."""
    while True:
        now = time.time()
        cpu_s, gc_s = read()
        cpu.append((now, cpu_s))
        gc.append((now, gc_s))
        if stop.is_set():
            return
        await wait_event(stop, every_s)


class BackendBench:
    """Runs every phase against one target."""

    def __init__(
        self,
        args: argparse.Namespace,
        target: Target,
        pool: ClientPool,
        population: Population,
        progress: Progress,
    ) -> None:
        self.args = args
        self.target = target
        self.pool = pool
        self.population = population
        self.progress = progress
        self.report = BackendReport(target.backend, target.description, notes=list(target.notes))
        self._drained: tuple[float, str] = (0.0, "")
        """The longest wait for the in-process relay before a phase, and that phase."""
        self._delivered: list[tuple[float, float]] = []
        """The in-server relay's delivery histogram, summed over the gRPC phases only."""

    def _jobs(self, kind: Kind, duration: float, serial: int = 0, total: int = 0) -> list[Job]:
        """One job per client process; ``serial`` > 0: that many calls from one stream;
        ``total`` > 0: that many in all (else ``--requests``, else time only)."""
        a = self.args
        max_calls = serial or total or a.requests or MAX_CALLS
        streams = [1] + [0] * (a.clients - 1) if serial else _split(a.concurrency, a.clients)
        calls = [serial] + [0] * (a.clients - 1) if serial else _split(max_calls, a.clients)
        start_at = time.time() + 0.2
        ratio = a.dup_ratio if kind is Kind.DUPMIX else a.conflict_ratio
        return [
            Job(
                kind=kind,
                target=self.target.address,
                population=self.population,
                streams=streams,
                max_calls=calls,
                start_at=start_at,
                duration_s=duration,
                timeout_s=a.timeout,
                body_bytes=a.body_bytes,
                ratio=ratio,
                page_size=a.page_size,
                seed=a.seed,
            )
            for streams, calls in zip(streams, calls, strict=True)
        ]

    async def _drain(self, label: str) -> None:
        """Before a phase: let the in-process relay deliver what earlier phases committed."""
        waited = await self.target.relay_drained()
        if waited is None:
            self.report.notes.append(f"the in-process relay had not drained before {label}")
        elif waited > self._drained[0]:
            self._drained = (waited, label)

    async def grpc_phase(
        self, kind: Kind, duration: float, label: str, serial: int = 0, total: int = 0
    ) -> Round:
        await self._drain(label)
        delivered = delivery_buckets(self.target)
        self.progress.begin(f"[{self.target.backend}] {label}", duration)
        before = await self.target.requests()
        limit = duration + self.args.timeout + 60
        jobs = self._jobs(kind, duration, serial, total)
        try:
            result = await self.pool.run(jobs, self.progress.tick, limit)
        finally:
            self.progress.end()
        await self.target.settled()
        got = Round(result, _delta(before, await self.target.requests()))
        if delivered:  # this phase's own deliveries, not the floors' backlogs
            await self.target.relay_drained()
            now = delivery_buckets(self.target)
            self._delivered = _summed(self._delivered, delivered, now)
        return got

    async def floor_phase(self, op: Callable[[], Awaitable[None]], label: str) -> Round:
        a = self.args
        await self._drain(label)
        self.progress.begin(f"[{self.target.backend}] {label}", a.duration)
        before = await self.target.requests()
        try:
            result = await run_ops(
                op, a.concurrency, a.duration, a.requests or MAX_CALLS, self.progress.tick
            )
        finally:
            self.progress.end()
        return Round(result, _delta(before, await self.target.requests()))

    async def sustained_phase(self) -> Round:
        """``--sustained`` fresh commits with the relay running; sets the report's slope."""
        target, total = self.target, self.args.sustained
        kind = Kind(self.args.sustained_workload)
        relay = RelayProcess(target.relay_config) if target.relay_config is not None else None
        samples: list[tuple[float, float]] = []
        gc_samples: list[tuple[float, float]] = []

        def read() -> tuple[float, float]:
            return time.process_time() + (relay.cpu_s() if relay is not None else 0.0), gc_seconds()

        if relay is not None:
            await relay.start()
        stop = asyncio.Event()
        sampler = (
            asyncio.create_task(sample_until(stop, read, samples, gc_samples))
            if target.server is not None
            else None
        )
        try:
            got = await self.grpc_phase(kind, SUSTAINED_LIMIT_S, SUSTAINED, total=total)
        finally:
            stop.set()
            if sampler is not None:
                await sampler
            if relay is not None:
                await relay.stop()
        result = got.result
        self.report.slope = slope.measure(
            result.completions, target.relay, result.first_ended, samples, gc_samples
        )
        return got

    async def run(self) -> BackendReport:
        a = self.args
        await create_population(self.target.address, self.population)
        if a.warmup > 0:
            warm = await self.grpc_phase(Kind.FRESH, a.warmup, "warm-up")
            if not warm.result.ok:
                raise BenchError(f"warm-up: no commit succeeded ({dict(warm.result.errors)})")
        floors: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        driver: StorageDriver | None = None
        backend = self.target.floor_backend
        if a.no_floors:
            self.report.notes.append("in-process floors skipped (--no-floors)")
        elif backend is None:
            self.report.notes.append("storage floor skipped: no backend address given")
        else:
            if self.target.own_floor_backend:  # not the server's store: needs the conversations
                await ensure_population(backend, self.population)
            driver = StorageDriver(backend, self.population, a.body_bytes, a.seed)
            committer = driver.committer_op(CommitLimits(sender_rate_per_s=0))
            floors = [
                ("storage-floor", driver.fresh),
                ("storage-replay", driver.replay),
                ("committer-floor", committer),
            ]
            lwt = await lwt_floor_op(backend, self.population.tenant)
            if lwt is not None:
                floors.append(("lwt-floor", lwt))
        rounds: dict[str, list[Round]] = {}
        if Kind.FRESH in a.kinds and a.serial_commits:
            serial = await self.grpc_phase(Kind.FRESH, a.duration, SERIAL, a.serial_commits)
            rounds[SERIAL] = [serial]
        for number in range(1, a.rounds + 1):
            suffix = f" (round {number}/{a.rounds})" if a.rounds > 1 else ""
            for kind in (Kind.GRPC_FLOOR, *a.kinds):
                got = await self.grpc_phase(kind, a.duration, kind.value + suffix)
                rounds.setdefault(kind.value, []).append(got)
            for name, op in floors:
                rounds.setdefault(name, []).append(await self.floor_phase(op, name + suffix))
            if driver is not None:
                driver.forget()  # the replay pool is refilled by the next round's floor
        if Kind.FRESH in a.kinds and a.sustained:
            rounds[SUSTAINED] = [await self.sustained_phase()]
        for name, measured in rounds.items():
            if name == SERIAL:
                kind_name, text = "workload", "new sends from ONE stream: the uncontended cost"
            elif name == SUSTAINED:
                kind_name, text = "workload", SUSTAINED_TEXT
            elif name in FLOOR_DESCRIPTIONS:
                kind_name, text = "floor", FLOOR_DESCRIPTIONS[name]
            else:
                kind = Kind(name)
                kind_name = "floor" if kind is Kind.GRPC_FLOOR else "workload"
                text = DESCRIPTIONS[kind]
            in_here = self.target.server is not None or name in FLOOR_DESCRIPTIONS
            self.report.phases[name] = Phase.build(name, kind_name, text, measured, in_here)
            self.report.rounds[name] = measured
        if self._drained[1]:
            waited, label = self._drained
            self.report.notes.append(
                "before each phase the in-process relay delivered what the earlier ones"
                f" committed (longest wait {waited:.1f} s, before {label})"
            )
        delivery = relay_delivery_note(self._delivered)
        if delivery:
            self.report.notes.append(delivery)
        if self.target.server is None:
            self.report.notes.append("server CPU not measured: the server is another process")
        if self.target.server is None and not self.target.metrics_url:
            self.report.notes.append("cost per op unavailable: pass --metrics-url")
        if backend is not None and Kind.BIG in a.kinds:
            from toolkit.bench.footprint import measure_footprint

            self.report.footprint = await measure_footprint(backend, self.population, a.body_bytes)
        if self.target.backend == "redis" and self.target.redis_url:
            from backends.redis.sizing import measure_committed_record

            self.report.redis_record = await measure_committed_record(
                self.target.redis_url, a.body_bytes
            )
        return self.report


DELIVERY_SERIES = "message_committer_relay_delivery_seconds"
DELIVERY_QUANTILES = (0.5, 0.9, 0.99)


def delivery_buckets(target: Target) -> list[tuple[float, float]]:
    """The in-server relay's delivery histogram as it is now: (bucket bound,
    cumulative count) in bound order; empty without an in-process relay."""
    server = target.server
    if server is None or server.relay is None:
        return []
    for metric in server.metrics.registry.collect():
        if metric.name == DELIVERY_SERIES:
            return [
                (float(s.labels["le"]), s.value)
                for s in metric.samples
                if s.name == DELIVERY_SERIES + "_bucket"
            ]
    return []


def _summed(
    total: list[tuple[float, float]],
    before: list[tuple[float, float]],
    after: list[tuple[float, float]],
) -> list[tuple[float, float]]:
    """``total`` plus what each bucket gained from ``before`` to ``after``."""
    base = total or [(le, 0.0) for le, _ in after]
    return [
        (le, sum_ + end - start)
        for (le, sum_), (_, start), (_, end) in zip(base, before, after, strict=True)
    ]


def relay_delivery_note(buckets: list[tuple[float, float]]) -> str:
    """The in-server relay's delivery latency (publication to the outbox until in
    every mailbox) of the gRPC phases' commits, as the bucket bounds of its
    histogram that hold the quantiles; empty without deliveries. The in-process
    floors' commits are left out: they arrive at tens of thousands per second,
    wait seconds for the relay, and would be most of the entries (issue 27)."""
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return ""
    bounds = [next(le for le, count in buckets if count >= q * total) for q in DELIVERY_QUANTILES]
    shown = ", ".join(
        f"p{q * 100:g} <= {le * 1e3:g} ms" for q, le in zip(DELIVERY_QUANTILES, bounds, strict=True)
    )
    return (
        "in-server relay delivery of the gRPC phases' commits, publication to every"
        f" mailbox: {shown} ({total:.0f} entries)"
    )


def _delta(before: Counter[str] | None, after: Counter[str] | None) -> Counter[str] | None:
    if before is None or after is None:
        return None
    return Counter({k: max(0, after[k] - before[k]) for k in set(before) | set(after)})
