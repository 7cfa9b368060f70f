"""Measure what one commit costs on a real cluster: LWTs and plain statements.

    python -m backends.scylla.cost --contact-points 127.0.0.1 --port 9042

Migrates a throwaway keyspace (dropped afterwards), commits ``--commits``
fresh messages through the real MessageCommitter (sequentially, so no
contention), then replays each, and prints the requests per commit as the
backend counted them (``lwt``: conditional statements and batches;
``statement``: plain reads and writes; ``serial_read``: reads at serial
consistency, only on contended or unknown-outcome paths). The counts include
the committer's membership read before reserve and the outbox write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from backends.scylla.backend import open_scylla_backend
from backends.scylla.migrate import migrate
from backends.scylla.session import CqlSession
from service.domain.committer import MessageCommitter
from service.domain.errors import StoreError
from service.domain.limits import CommitLimits
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from service.domain.ports import Backend

KINDS = ("lwt", "statement", "serial_read")


@dataclass(frozen=True)
class Cost:
    fresh: dict[str, float]
    replay: dict[str, float]
    fresh_ms: float
    replay_ms: float


async def measure(
    contact_points: Sequence[str],
    *,
    port: int,
    commits: int = 20,
    replication: str = "SimpleStrategy:1",
    username: str | None = None,
    password: str | None = None,
) -> Cost:
    """Per-commit averages over ``commits`` fresh commits and their replays."""
    keyspace = f"mc_cost_{uuid.uuid4().hex[:12]}"
    await migrate(
        contact_points,
        port=port,
        keyspace=keyspace,
        replication=replication,
        username=username,
        password=password,
    )
    try:
        backend = await open_scylla_backend(
            contact_points, port=port, keyspace=keyspace, username=username, password=password
        )
        try:
            return await _measure(backend, commits)
        finally:
            await backend.close()
    finally:
        cql = await CqlSession.connect(
            contact_points,
            port=port,
            keyspace=keyspace,
            requests=Counter(),
            username=username,
            password=password,
        )
        try:
            await cql.simple("DROP KEYSPACE IF EXISTS {ks}", timeout_s=60)
        finally:
            await cql.close()


async def _measure(backend: Backend, commits: int) -> Cost:
    await backend.membership.create_conversation("cost", "c1", ["alice", "bob"])
    committer = MessageCommitter(
        backend.store,
        backend.membership,
        backend.outbox,
        limits=CommitLimits(sender_rate_per_s=0),
    )
    sends = [
        AuthenticatedSend(
            "cost", "alice", "phone", "c1", f"cm-{i}", MessageContent(MessageType.TEXT, b"x" * 100)
        )
        for i in range(commits)
    ]
    await committer.commit_send(sends[0])  # warm-up: first-use writes (the outbox day row)
    backend.requests.clear()
    started = time.perf_counter()
    for send in sends[1:]:
        await committer.commit_send(send)
    fresh_ms = (time.perf_counter() - started) * 1000
    fresh = Counter(backend.requests)
    backend.requests.clear()
    started = time.perf_counter()
    for send in sends[1:]:
        await committer.commit_send(send)
    replay_ms = (time.perf_counter() - started) * 1000
    replay = Counter(backend.requests)
    n = max(1, commits - 1)
    return Cost(
        {k: fresh[k] / n for k in KINDS},
        {k: replay[k] / n for k in KINDS},
        fresh_ms / n,
        replay_ms / n,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backends.scylla.cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--contact-points", required=True, help="comma-separated hosts")
    parser.add_argument("--port", type=int, default=9042)
    parser.add_argument("--commits", type=int, default=20, help="fresh commits to average over")
    parser.add_argument("--replication", default="SimpleStrategy:1")
    args = parser.parse_args(argv)
    points = [p.strip() for p in args.contact_points.split(",") if p.strip()]
    try:
        cost = asyncio.run(
            measure(
                points,
                port=args.port,
                commits=max(2, args.commits),
                replication=args.replication,
                username=os.environ.get("MC_SCYLLA_USERNAME") or None,
                password=os.environ.get("MC_SCYLLA_PASSWORD") or None,
            )
        )
    except StoreError as exc:
        print(f"cost: {exc}", file=sys.stderr)
        return 1
    print(f"{'per commit':<14}{'lwt':>8}{'statement':>11}{'serial_read':>13}{'ms':>9}")
    for label, counts, ms in (
        ("fresh", cost.fresh, cost.fresh_ms),
        ("replay", cost.replay, cost.replay_ms),
    ):
        print(
            f"{label:<14}{counts['lwt']:>8.2f}{counts['statement']:>11.2f}"
            f"{counts['serial_read']:>13.2f}{ms:>9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
