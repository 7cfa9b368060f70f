"""``bench-delivery --idle-streams N``: what idle Subscribe streams cost a replica.

A replica holds one Subscribe stream per online device. Idle, a stream should
cost a little memory and its heartbeats, never Commit's latency (issue 23,
item 6: each stream used to hold one of the unary RPC slots and read its
lanes every second). The phase, on the server the bench runs in this process,
alternates runs without and with the streams so that a drift of the shared
machine shows up as two different baselines around a run, not as the streams'
cost:

    without(0), [open, with(1), close, without(1)], ..., [open, with(R), close, without(R)]

* **without**: ``--idle-commits`` commits at ``--concurrency``, latencies
  recorded per commit;
* **open**: a holder subprocess (``python -m toolkit.bench.idle``) opens N
  streams over ``HOLDER_CHANNELS`` connections, ``STREAMS_PER_USER`` per user
  (under the per-user cap), and says ``ready`` once every stream has had its
  first message; the server's memory is read before and after (``VmRSS`` of this
  process, which runs the server; the streams' client side lives in the holder,
  so it is not counted);
* **with**: the same commits while the N streams stay open;
* **close**: the holder cancels its streams and exits.

Printed: p50 / p99 of every run; per round, p99 with the streams over the mean
p99 of the runs without just before and just after it; the median of those
ratios (``--idle-rounds``, default 3), and the server memory per idle stream
(the median of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from service.client import CommitClient
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from service.gen.message_committer.v1 import mailbox_pb2, mailbox_pb2_grpc
from toolkit.bench.driver import BenchError

HOLDER_CHANNELS = 50
"""Connections the holder spreads its streams over (one HTTP/2 connection each)."""
STREAMS_PER_USER = 8
"""Streams per user: half the replica's per-user cap (``MC_MAX_STREAMS_PER_USER``, default 16)."""
WAVE = 250
"""Streams the holder opens at once."""
READY_TIMEOUT_S = 300.0
SETTLE_S = 2.0
"""Pause after the streams are up, before memory is read (late allocations), and
after they are closed, before the last run."""


@dataclass
class IdleFigures:
    backend: str
    streams: int
    commits: int
    rounds: int
    p50_without_ms: list[float]
    """One per run without the streams: ``rounds + 1`` of them, in run order."""
    p99_without_ms: list[float]
    p50_with_ms: list[float]
    """One per run with the streams: ``rounds`` of them."""
    p99_with_ms: list[float]
    p99_ratios: list[float]
    """Per round: p99 with the streams over the mean p99 of the runs around it."""
    p99_ratio: float
    """The median of ``p99_ratios``."""
    rss_per_stream_kib: float
    """The median over the rounds of the server's growth per stream opened."""
    open_s: float
    """How long the holder took to open every stream and get its first message
    (the median of the rounds)."""


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_kib() -> int:
    """This process's resident set size (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError("VmRSS is not in /proc/self/status")


async def _commits(
    client: CommitClient, tenant: str, run: str, count: int, concurrency: int
) -> list[float]:
    """``count`` fresh commits at ``concurrency``; each one's latency in ms."""
    content = MessageContent(MessageType.TEXT, b"x" * 100)
    latencies: list[float] = []
    queue = iter(range(count))

    async def worker() -> None:
        for n in queue:
            send = AuthenticatedSend(tenant, "a", "bench", "idle", f"{run}-{n}", content)
            started = time.perf_counter()
            await client.commit(send)
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


class Holder:
    """The subprocess that holds the idle streams."""

    def __init__(self, target: str, tenant: str, streams: int) -> None:
        command = [sys.executable, "-m", "toolkit.bench.idle", target, tenant, str(streams)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    async def ready(self) -> None:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(
            asyncio.to_thread(self.process.stdout.readline), READY_TIMEOUT_S
        )
        if not line.startswith("ready"):
            self.close()
            raise BenchError(f"the stream holder did not get its streams up: {line.strip()!r}")

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # the holder's cue to cancel its streams and exit
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


async def idle_phase(
    client: CommitClient, target: str, backend: str, tenant: str, args: argparse.Namespace
) -> IdleFigures:
    streams, count, concurrency = int(args.idle_streams), int(args.idle_commits), args.concurrency
    rounds = int(args.idle_rounds)
    await client.create_conversation(tenant, "idle", ["a", "b"])
    await _commits(client, tenant, "warm", min(count, 200), concurrency)
    without = [await _commits(client, tenant, "without-0", count, concurrency)]
    loaded: list[list[float]] = []
    grown: list[float] = []
    opened: list[float] = []
    for r in range(1, rounds + 1):
        before = rss_kib()
        started = time.monotonic()
        holder = Holder(target, tenant, streams)
        try:
            await holder.ready()
            opened.append(time.monotonic() - started)
            await asyncio.sleep(SETTLE_S)
            grown.append((rss_kib() - before) / streams)
            loaded.append(await _commits(client, tenant, f"with-{r}", count, concurrency))
        finally:
            await asyncio.to_thread(holder.close)
        await asyncio.sleep(SETTLE_S)  # the server finishes the cancelled streams first
        without.append(await _commits(client, tenant, f"without-{r}", count, concurrency))
    p99_without = [_quantile(run, 0.99) for run in without]
    p99_with = [_quantile(run, 0.99) for run in loaded]
    ratios = [w / ((p99_without[i] + p99_without[i + 1]) / 2) for i, w in enumerate(p99_with)]
    return IdleFigures(
        backend=backend,
        streams=streams,
        commits=count,
        rounds=rounds,
        p50_without_ms=[round(statistics.median(run), 2) for run in without],
        p99_without_ms=[round(v, 2) for v in p99_without],
        p50_with_ms=[round(statistics.median(run), 2) for run in loaded],
        p99_with_ms=[round(v, 2) for v in p99_with],
        p99_ratios=[round(v, 3) for v in ratios],
        p99_ratio=round(statistics.median(ratios), 3),
        rss_per_stream_kib=round(statistics.median(grown), 2),
        open_s=round(statistics.median(opened), 1),
    )


def idle_text(f: IdleFigures) -> str:
    def runs(values: list[float]) -> str:
        return " ".join(f"{v}" for v in values)

    return (
        f"idle streams ({f.backend}): {f.streams} open in {f.open_s}s;"
        f" {f.commits} commits per run, {f.rounds} rounds;"
        f" p99 ms without {runs(f.p99_without_ms)}, with {runs(f.p99_with_ms)}"
        f" (p50 without {runs(f.p50_without_ms)}, with {runs(f.p50_with_ms)});"
        f" p99 with/around per round {runs(f.p99_ratios)}, median {f.p99_ratio};"
        f" server memory {f.rss_per_stream_kib} KiB per stream"
    )


# --- the holder subprocess ------------------------------------------------------------


async def _hold(target: str, tenant: str, streams: int) -> int:
    """Open the streams in waves of ``WAVE`` on connections already up (a burst
    of new streams before a connection's HTTP/2 settings are known is refused
    by the transport), each wave once the last has had its first messages."""
    channels = [
        aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(min(HOLDER_CHANNELS, streams))
    ]
    calls: list[aio.UnaryStreamCall[mailbox_pb2.SubscribeRequest, mailbox_pb2.SubscribeResponse]]
    calls = []
    failed = ""
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await asyncio.gather(*(c.channel_ready() for c in channels))
            for start in range(0, streams, WAVE):
                wave = []
                for n in range(start, min(streams, start + WAVE)):
                    stub = mailbox_pb2_grpc.MailboxServiceStub(channels[n % len(channels)])
                    user = f"idle-{n // STREAMS_PER_USER:05d}"
                    request = mailbox_pb2.SubscribeRequest(tenant=tenant, user=user)
                    wave.append(stub.Subscribe(request))
                calls += wave
                await asyncio.gather(*(c.read() for c in wave))
    except (TimeoutError, grpc.RpcError) as exc:
        failed = f"{type(exc).__name__} after {len(calls)} streams"
    print(f"failed {failed}" if failed else f"ready {streams}", flush=True)
    if not failed:
        await asyncio.to_thread(sys.stdin.read)  # held until the bench closes our stdin
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    target, tenant, streams = list(sys.argv[1:] if argv is None else argv)
    return asyncio.run(_hold(target, tenant, int(streams)))


if __name__ == "__main__":
    sys.exit(main())
