"""Client processes that drive the server over real gRPC.

``ClientPool`` spawns ``clients`` processes (the ``spawn`` start method: a
process that runs a gRPC server must not fork). Each keeps one event loop
and one channel per target for its whole life, and runs one ``Job`` at a
time: ``streams`` coroutines, each sending one unary call after another
until the job's call budget or its deadline runs out, whichever is first.
Every process starts at the same wall-clock instant. A call counts when it
got the outcome it expected (OK, or ALREADY_EXISTS for a conflicting reuse)
and the answer checked out; anything else is counted by status code
(``WRONG_ANSWER``: an OK whose content was wrong; ``WRONG_ACK``: a
conflicting reuse that was acknowledged).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import random
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import grpc
from grpc import aio

from toolkit.bench.workloads import (
    ADD_MEMBERS,
    COMMIT,
    CREATE_CONVERSATION,
    HEALTH_CHECK,
    HISTORY,
    Job,
    Plan,
    Population,
    Sends,
)

RESET = "reset"
"""Tells a client process to close its channels (before the server stops)."""
ERROR_PAUSE_S = 0.001
"""A stream pauses this long after an unexpected outcome, so a dead server
does not turn the loop into a busy spin (the loop is bounded anyway)."""


class BenchError(RuntimeError):
    """The benchmark itself could not run (not a figure the service produced)."""


@dataclass
class PhaseResult:
    """Outcome of one workload in one process (or merged over all of them)."""

    calls: int = 0
    ok: int = 0
    latencies_us: array[float] = field(default_factory=lambda: array("d"))
    """Latency of every call that got its expected outcome, in microseconds."""
    completions: array[float] = field(default_factory=lambda: array("d"))
    """When each of those calls ended (``time.time()``, comparable across the client
    processes): the sustained phase's rate over its first and last commits."""
    expected: Counter[str] = field(default_factory=Counter)
    """Expected outcomes by status code (OK, ALREADY_EXISTS)."""
    errors: Counter[str] = field(default_factory=Counter)
    """Unexpected outcomes by status code, WRONG_ANSWER or WRONG_ACK."""
    started: float = 0.0
    ended: float = 0.0
    first_ended: float = 0.0
    """When the first client process stopped (merged: the end of the span in which
    every process was sending; one process: its own end)."""
    client_cpu_s: float = 0.0
    """CPU time the client processes spent (0 for in-process floors)."""
    server_cpu_s: float = 0.0
    """CPU time of this (the server's) process over the phase."""
    server_gc_s: float = 0.0
    """Time this (the server's) process spent in the cyclic garbage collector."""

    @property
    def elapsed_s(self) -> float:
        return max(self.ended - self.started, 1e-9)

    @staticmethod
    def merge(parts: Sequence[PhaseResult]) -> PhaseResult:
        out = PhaseResult()
        for part in parts:
            out.calls += part.calls
            out.ok += part.ok
            out.latencies_us.extend(part.latencies_us)
            out.completions.extend(part.completions)
            out.expected.update(part.expected)
            out.errors.update(part.errors)
            out.client_cpu_s += part.client_cpu_s
            out.server_cpu_s += part.server_cpu_s
            out.server_gc_s += part.server_gc_s
        if parts:
            out.started = min(p.started for p in parts)
            out.ended = max(p.ended for p in parts)
            out.first_ended = min(p.first_ended or p.ended for p in parts)
        return out


class GcTimer:
    """Total time this process spent in the garbage collector (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._start

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)


GC_TIMER: GcTimer | None = None


def gc_seconds() -> float:
    """GC time of this process so far (the timer starts on the first call)."""
    global GC_TIMER
    if GC_TIMER is None:
        GC_TIMER = GcTimer()
    return GC_TIMER.total_s


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """A client process could not run its job."""

    message: str


class Tally:
    """Counts of one process for one job; ``record`` is called per call."""

    def __init__(self, progress: Callable[[int], None]) -> None:
        self.result = PhaseResult()
        self._progress = progress

    def record(self, latency_s: float, outcome: str, expected: bool) -> None:
        r = self.result
        r.calls += 1
        if expected:
            r.ok += 1
            r.latencies_us.append(latency_s * 1e6)
            r.completions.append(time.time())
            r.expected[outcome] += 1
        else:
            r.errors[outcome] += 1
        self._progress(r.calls)


async def _stream(
    job: Job,
    plan: Plan,
    callables: dict[str, aio.UnaryUnaryMultiCallable[bytes, bytes]],
    deadline: float,
    budget: list[int],
    tally: Tally,
) -> None:
    perf = time.perf_counter
    while budget[0] > 0 and time.monotonic() < deadline:
        budget[0] -= 1
        call = plan.next_call()
        start = perf()
        try:
            response = await callables[call.method](call.request, timeout=job.timeout_s)
        except aio.AioRpcError as exc:
            code = exc.code()
            expected = not call.expect_ok and code is grpc.StatusCode.ALREADY_EXISTS
            tally.record(perf() - start, code.name, expected)
            if not expected:
                await asyncio.sleep(ERROR_PAUSE_S)
            continue
        latency = perf() - start
        if not call.expect_ok:
            tally.record(latency, "WRONG_ACK", False)
        elif call.check is not None and not call.check(response):
            tally.record(latency, "WRONG_ANSWER", False)
        else:
            tally.record(latency, "OK", True)


class _Worker:
    """The state one client process keeps between jobs."""

    def __init__(self, index: int, progress: Any) -> None:
        self.index = index
        self._progress = progress
        self._channels: dict[str, aio.Channel] = {}
        self._sends: dict[tuple[str, str], Sends] = {}

    async def channel(self, target: str) -> aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = aio.insecure_channel(target)
            await asyncio.wait_for(channel.channel_ready(), timeout=10)
            self._channels[target] = channel
        return channel

    def sends(self, job: Job) -> Sends:
        key = (job.target, job.population.tenant)
        sends = self._sends.get(key)
        if sends is None:
            self._sends.clear()  # a new run: forget the last one's committed keys
            rng = random.Random(job.seed * 1_000_003 + self.index)
            sends = Sends(job.population, self.index, job.body_bytes, rng)
            self._sends[key] = sends
        return sends

    async def run(self, job: Job) -> PhaseResult:
        channel = await self.channel(job.target)
        sends = self.sends(job)
        callables: dict[str, aio.UnaryUnaryMultiCallable[bytes, bytes]] = {
            method: channel.unary_unary(method) for method in (COMMIT, HISTORY, HEALTH_CHECK)
        }
        plans = [Plan(job, sends, self.index * job.streams + s) for s in range(job.streams)]
        progress = self._progress
        index = self.index

        def report(calls: int) -> None:
            progress[index] = calls

        report(0)
        tally = Tally(report)
        budget = [job.max_calls]
        await asyncio.sleep(max(0.0, job.start_at - time.time()))
        deadline = time.monotonic() + job.duration_s
        tally.result.started = time.time()
        cpu = time.process_time()
        await asyncio.gather(
            *(_stream(job, plan, callables, deadline, budget, tally) for plan in plans)
        )
        tally.result.client_cpu_s = time.process_time() - cpu
        tally.result.ended = time.time()
        return tally.result

    async def close(self) -> None:
        """Close every channel and forget every run's keys."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._sends.clear()
        for channel in channels:
            await channel.close()


def _worker_main(index: int, conn: Connection, progress: Any) -> None:
    asyncio.run(_serve(index, conn, progress))


async def _serve(index: int, conn: Connection, progress: Any) -> None:
    worker = _Worker(index, progress)
    try:
        while True:
            try:
                job = await asyncio.to_thread(conn.recv)
            except (EOFError, OSError):
                return  # the coordinator went away
            if job is None:
                return
            if job == RESET:
                await worker.close()
                conn.send(RESET)
                continue
            try:
                result: PhaseResult | WorkerFailure = await worker.run(job)
            except Exception as exc:  # reported to the coordinator, which fails the run
                result = WorkerFailure(f"{type(exc).__name__}: {exc}")
            conn.send(result)
    finally:
        await worker.close()


class ClientPool:
    """``clients`` long-lived client processes."""

    def __init__(self, clients: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.clients = clients
        self._progress = ctx.RawArray("q", clients)
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        for index in range(clients):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(index, child, self._progress),
                name=f"bench-client-{index}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    def calls_so_far(self) -> int:
        return int(sum(self._progress))

    async def run(
        self, jobs: Sequence[Job], on_tick: Callable[[int], None], limit_s: float
    ) -> PhaseResult:
        """Run one job per process; return the merged result."""
        if len(jobs) != self.clients:
            raise ValueError("one job per client process")
        for index in range(self.clients):
            self._progress[index] = 0
        for conn, job in zip(self._conns, jobs, strict=True):
            conn.send(job)
        results: dict[int, PhaseResult] = {}
        cpu, gc_s = time.process_time(), gc_seconds()
        deadline = time.monotonic() + limit_s
        while len(results) < self.clients:
            for index, conn in enumerate(self._conns):
                if index in results or not conn.poll():
                    continue
                try:
                    got = conn.recv()
                except (EOFError, OSError) as exc:
                    raise BenchError(f"client process {index} went away") from exc
                if isinstance(got, WorkerFailure):
                    raise BenchError(f"client process {index} failed: {got.message}")
                results[index] = got
            if len(results) == self.clients:
                break
            if any(not p.is_alive() for p in self._procs):
                raise BenchError("a client process died")
            if time.monotonic() > deadline:
                raise BenchError(f"client processes did not finish within {limit_s:.0f}s")
            on_tick(self.calls_so_far())
            await asyncio.sleep(0.05)
        merged = PhaseResult.merge([results[i] for i in range(self.clients)])
        merged.server_cpu_s = time.process_time() - cpu
        merged.server_gc_s = gc_seconds() - gc_s
        return merged

    async def reset(self, timeout_s: float = 10.0) -> None:
        """Have every process close its channels and forget its keys."""
        for conn in self._conns:
            conn.send(RESET)
        deadline = time.monotonic() + timeout_s
        for index, conn in enumerate(self._conns):
            while not conn.poll():
                if time.monotonic() > deadline or not self._procs[index].is_alive():
                    raise BenchError(f"client process {index} did not reset")
                await asyncio.sleep(0.02)
            conn.recv()

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        for conn in self._conns:
            conn.close()
        self._procs.clear()
        self._conns.clear()


async def create_population(
    target: str, population: Population, concurrency: int = 16, timeout_s: float = 300
) -> int:
    """Create every conversation over gRPC; return how many were created.

    ALREADY_EXISTS counts as done (a rerun against the same tenant)."""
    created = 0
    deadline = time.monotonic() + timeout_s
    async with aio.insecure_channel(target) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=10)
        create: aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(CREATE_CONVERSATION)
        add: aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(ADD_MEMBERS)

        async def all_of(
            method: aio.UnaryUnaryMultiCallable[bytes, bytes], requests: Any, streams: int
        ) -> None:
            queue = iter(requests)

            async def one() -> None:
                nonlocal created
                for request in queue:
                    if time.monotonic() > deadline:
                        raise BenchError("creating the conversations took too long")
                    try:
                        await method(request, timeout=60)
                    except aio.AioRpcError as exc:
                        if exc.code() is not grpc.StatusCode.ALREADY_EXISTS:
                            raise BenchError(f"creating members failed: {exc.code().name}") from exc
                    created += 1

            await asyncio.gather(*(one() for _ in range(streams)))

        await all_of(create, list(population.create_requests()), concurrency)
        # The big ones, after they exist: one page at a time per conversation, since a
        # conversation's membership changes apply one after another anyway (pages sent
        # at once would only queue, past their deadline, on a slow backend).
        await asyncio.gather(*(all_of(add, pages, 1) for pages in population.add_requests()))
    return created
