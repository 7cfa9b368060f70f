"""``message-committer bench-delivery``: commit-to-mailbox latency and fan-out throughput.

    message-committer bench-delivery --backend redis [--members 4,64,1000] [--quick]

For each backend and each conversation size (members) it runs the real
server in this process (``toolkit.bench.environment``) and the real relay:
inside that server on memory, as a ``message-committer relay`` subprocess on
Redis and Scylla. Two phases per size:

* **latency**: ``--latency-messages`` commits, one at a time (the next once
  the previous reached the sampled mailboxes, ``--pace`` later), with the
  relay running: the latency of a relay that is not behind. Per message,
  commit-to-mailbox latency is ``delivered_ts_ms - server_ts_ms`` of its
  mailbox entry (both taken on this host: the server's clock at commit, the
  backend's at the append), the largest over the sampled recipients (first,
  middle, last member).
* **throughput**: ``--messages`` commits as fast as ``--concurrency`` allows
  while the relay is stopped (SIGSTOP; memory: running, it cannot be
  paused), then the relay goes on: fan-out throughput is the mailbox entries
  written (messages x members) over the time from the first to the last
  append, read back from every member's mailbox.

Prints one table (p50/p99 latency in ms, entries/s and messages/s of the
fan-out) and writes ``--json``. Figures from one run on a shared machine:
quote them with the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from service.client import CommitClient, RetryPolicy
from service.config import DEFAULT_MAX_STREAMS as MAX_STREAMS
from service.config import ServiceConfig
from service.domain.mailbox import MailboxCursor
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from toolkit.bench.driver import BenchError
from toolkit.bench.environment import BackendAddress, Environment, run_tag
from toolkit.bench.idle import IdleFigures, idle_phase, idle_text

BACKENDS = ("memory", "redis", "scylla")
RELAY_START_S = 60.0
DRAIN_TIMEOUT_S = 600.0
RETRY = RetryPolicy(max_attempts=20, attempt_timeout_s=10.0, deadline_s=60.0)


@dataclass
class Figures:
    backend: str
    members: int
    latency_messages: int
    p50_ms: float
    p99_ms: float
    messages: int
    entries: int
    fanout_s: float
    entries_per_s: float
    messages_per_s: float
    note: str = ""


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="message-committer bench-delivery", description=__doc__)
    p.add_argument("--backend", required=True, help="memory, redis, scylla, a list, or all")
    p.add_argument("--members", default="4,64,1000", help="conversation sizes ('' for none)")
    p.add_argument("--messages", type=int, default=0, help="throughput phase (0: by size)")
    p.add_argument("--latency-messages", type=int, default=100)
    p.add_argument("--pace", type=float, default=0.01, help="pause between latency commits (s)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--body-bytes", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="a smoke run: few messages")
    p.add_argument(
        "--idle-streams",
        type=int,
        default=0,
        help="also N idle Subscribe streams: Commit p99 with and without, memory per stream",
    )
    p.add_argument("--idle-commits", type=int, default=2000, help="commits per idle-streams run")
    p.add_argument(
        "--idle-rounds",
        type=int,
        default=3,
        help="idle-streams rounds (runs with the streams, each between two runs without)",
    )
    p.add_argument("--json", type=Path, default=Path("bench-delivery.json"), metavar="PATH")
    p.add_argument("--redis-url", default=env("MC_REDIS_URL", ""))
    p.add_argument("--scylla-contact-points", default=env("MC_SCYLLA_CONTACT_POINTS", ""))
    p.add_argument("--scylla-port", type=int, default=int(env("MC_SCYLLA_PORT", "9042")))
    p.add_argument("--scylla-keyspace", default=env("MC_SCYLLA_KEYSPACE", ""))
    return p


def _messages_for(members: int, args: argparse.Namespace) -> int:
    if args.messages:
        return int(args.messages)
    if args.quick:
        return max(5, 400 // members)
    return max(50, 20_000 // members)


def _relay_env(config: ServiceConfig) -> dict[str, str]:
    env = {
        "MC_BACKEND": config.backend,
        "MC_RELAY_LEASE": "120s",  # a stopped relay keeps its leases through the phase
        "MC_RELAY_IDLE_WAIT": "100ms",
        "MC_RELAY_HTTP_ADDRESS": "127.0.0.1:0",
        "MC_LOG_LEVEL": "INFO",
    }
    if config.backend == "redis":
        env |= {"MC_REDIS_URL": config.redis_url, "MC_REDIS_PREFIX": config.redis_prefix}
    if config.backend == "scylla":
        env |= {
            "MC_SCYLLA_CONTACT_POINTS": ",".join(config.scylla_contact_points),
            "MC_SCYLLA_PORT": str(config.scylla_port),
            "MC_SCYLLA_KEYSPACE": config.scylla_keyspace,
            "MC_RELAY_SETTLE_WINDOW": "5s",
        }
    return env


class Relay:
    """The relay of a run: a subprocess we can stop and continue (None on memory)."""

    def __init__(self, config: ServiceConfig) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="mc-bench-relay-", delete=False)  # noqa: SIM115
        if config.backend == "memory":
            return
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "relay"],
            env={**os.environ, **_relay_env(config)},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    async def wait_started(self) -> None:
        deadline = time.monotonic() + RELAY_START_S
        while self.process is not None:
            if b"relaying as" in await asyncio.to_thread(Path(self._log.name).read_bytes):
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BenchError("the relay did not start (see its log with MC_LOG_LEVEL)")
            await asyncio.sleep(0.1)

    def pause(self) -> bool:
        if self.process is None:
            return False
        self.process.send_signal(signal.SIGSTOP)
        return True

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


def _send(tenant: str, conversation: str, sender: str, n: int, body: bytes) -> AuthenticatedSend:
    content = MessageContent(MessageType.TEXT, body)
    return AuthenticatedSend(tenant, sender, "bench", conversation, f"m-{n}", content)


async def _entries(client: CommitClient, tenant: str, user: str) -> dict[str, tuple[int, int]]:
    """message id -> (server_ts_ms, delivered_ts_ms) of a user's inbox."""
    found: dict[str, tuple[int, int]] = {}
    cursor = MailboxCursor()
    for _ in range(100_000):
        page = await client.sync(tenant, user, cursor, limit=1000)
        for e in page.entries:
            found[e.record.message_id] = (e.record.server_ts_ms, e.appended_ms)
        cursor = page.next_cursor
        if not page.more:
            break
    return found


async def _wait_delivered(
    client: CommitClient, tenant: str, users: Sequence[str], ids: set[str], poll_s: float = 0.05
) -> dict[str, dict[str, tuple[int, int]]]:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    seen: dict[str, dict[str, tuple[int, int]]] = {}
    for user in users:
        while True:
            got = await _entries(client, tenant, user)
            if ids <= set(got):
                seen[user] = got
                break
            if time.monotonic() > deadline:
                raise BenchError("the relay did not deliver everything in time")
            await asyncio.sleep(poll_s)
    return seen


async def _one_size(
    client: CommitClient, relay: Relay, backend: str, members: int, args: argparse.Namespace
) -> Figures:
    tenant, conversation = f"bench-{run_tag()}", f"d{members}"
    users = [f"u{n:05d}" for n in range(members)]
    for start in range(0, members, 10_000):
        page = users[start : start + 10_000]
        if start == 0:
            await client.create_conversation(tenant, conversation, page)
        else:
            await client.add_members(tenant, conversation, page)
    body = b"x" * args.body_bytes
    sample = sorted({users[0], users[members // 2], users[-1]})

    # warm-up: the relay holds its partitions and has delivered once
    warm = await client.commit(_send(tenant, conversation, users[0], 0, body))
    await _wait_delivered(client, tenant, sample, {warm.message_id})
    # latency: one message at a time, the next once the previous is delivered
    count = 5 if args.quick else int(args.latency_messages)
    latencies: list[int] = []
    for n in range(1, count + 1):
        ack = await client.commit(_send(tenant, conversation, users[n % members], n, body))
        seen = await _wait_delivered(client, tenant, sample, {ack.message_id}, poll_s=0.002)
        latencies.append(
            max(seen[u][ack.message_id][1] - seen[u][ack.message_id][0] for u in sample)
        )
        await asyncio.sleep(args.pace)
    # throughput: commits while the relay is stopped, then the relay drains them
    total = _messages_for(members, args)
    paused = relay.pause()
    batch: set[str] = set()
    queue = iter(range(count + 1, count + 1 + total))

    async def worker() -> None:
        for n in queue:
            ack = await client.commit(_send(tenant, conversation, users[n % members], n, body))
            batch.add(ack.message_id)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    relay.resume()
    delivered = await _wait_delivered(client, tenant, users, batch)
    appended = [t for got in delivered.values() for mid, (_, t) in got.items() if mid in batch]
    span_s = max(0.001, (max(appended) - min(appended)) / 1000)
    entries = total * members
    return Figures(
        backend=backend,
        members=members,
        latency_messages=count,
        p50_ms=statistics.median(latencies),
        p99_ms=_quantile(latencies, 0.99),
        messages=total,
        entries=entries,
        fanout_s=round(span_s, 3),
        entries_per_s=round(entries / span_s, 1),
        messages_per_s=round(total / span_s, 1),
        note="" if paused else "relay inside serve: commits and fan-out overlap",
    )


def _quantile(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


async def _run(
    args: argparse.Namespace, backends: list[str], idle: list[IdleFigures]
) -> list[Figures]:
    given = BackendAddress(
        redis_url=args.redis_url,
        scylla_contact_points=tuple(p for p in args.scylla_contact_points.split(",") if p),
        scylla_port=args.scylla_port,
        scylla_keyspace=args.scylla_keyspace,
    )
    environment = Environment(given, run_tag())
    results: list[Figures] = []
    try:
        for backend in backends:
            target = await environment.start(backend)
            config = await environment.config(backend)
            relay = Relay(config)
            client = CommitClient.connect(target.address, retry=RETRY)
            try:
                await relay.wait_started()
                for members in (int(m) for m in args.members.split(",") if m.strip()):
                    figures = await _one_size(client, relay, backend, members, args)
                    results.append(figures)
                    print(_row(figures), flush=True)
                if args.idle_streams > 0:
                    tenant = f"bench-idle-{run_tag()}"
                    found = await idle_phase(client, target.address, backend, tenant, args)
                    idle.append(found)
                    print(idle_text(found), flush=True)
            finally:
                await client.close()
                relay.close()
                await target.close()
    finally:
        environment.close()
    return results


HEADER = (
    f"{'backend':8} {'members':>7} {'lat n':>6} {'p50 ms':>8} {'p99 ms':>8}"
    f" {'messages':>8} {'entries':>8} {'entries/s':>10} {'msgs/s':>8}  note"
)


def _row(f: Figures) -> str:
    return (
        f"{f.backend:8} {f.members:>7} {f.latency_messages:>6} {f.p50_ms:>8.1f} {f.p99_ms:>8.1f}"
        f" {f.messages:>8} {f.entries:>8} {f.entries_per_s:>10.0f} {f.messages_per_s:>8.1f}"
        f"  {f.note}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    chosen = list(BACKENDS) if args.backend == "all" else args.backend.split(",")
    if any(b not in BACKENDS for b in chosen):
        print("bench-delivery: --backend must be memory, redis, scylla or all", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    if not 0 <= args.idle_streams <= MAX_STREAMS or min(args.idle_commits, args.idle_rounds) < 1:
        print(
            f"bench-delivery: --idle-streams 0 to {MAX_STREAMS};"
            " --idle-commits and --idle-rounds at least 1",
            file=sys.stderr,
        )
        return 2
    print(HEADER, flush=True)
    idle: list[IdleFigures] = []
    try:
        results = asyncio.run(_run(args, chosen, idle))
    except BenchError as exc:
        print(f"bench-delivery: {exc}", file=sys.stderr)
        return 1
    saved = {"sizes": [asdict(f) for f in results], "idle_streams": [asdict(f) for f in idle]}
    args.json.write_text(json.dumps(saved, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
