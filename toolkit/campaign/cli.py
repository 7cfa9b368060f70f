"""``message-committer fault-campaign``: many seeded fault scenarios, one verdict.

Runs seeds ``first .. first+N-1`` against a backend, prints one line per
failing seed (replay it with ``--first-seed S --seeds 1``), a table of which
fault kinds fired and how often, and last the number of invariant
violations. Exits 1 when there is any.

Backends: ``memory`` (a fresh one per seed), ``redis`` (``--redis-url`` or
MC_REDIS_URL; a fresh key prefix per run) and ``scylla``
(``--scylla-contact-points``/``--scylla-port``/``--scylla-keyspace`` or the
MC_SCYLLA_* variables; the keyspace must be migrated). Every scenario uses
its own tenant, so a campaign never touches other data.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

from backends.memory import open_memory_backend
from service.domain.ports import Backend, ManualClock
from toolkit.campaign.scenario import BackendFaults, run_scenario

Opener = Callable[[], Awaitable[Backend]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="message-committer fault-campaign",
        description="Run seeded fault scenarios and check every invariant.",
    )
    p.add_argument("--backend", choices=["memory", "redis", "scylla"], required=True)
    p.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed")
    p.add_argument("--steps", type=int, default=None, help="steps per scenario (default: drawn)")
    p.add_argument("--verbose", action="store_true", help="log every recoverable stop")
    p.add_argument("--redis-url", default=os.environ.get("MC_REDIS_URL", ""))
    p.add_argument(
        "--scylla-contact-points", default=os.environ.get("MC_SCYLLA_CONTACT_POINTS", "")
    )
    p.add_argument("--scylla-port", type=int, default=int(os.environ.get("MC_SCYLLA_PORT", 9042)))
    p.add_argument(
        "--scylla-keyspace", default=os.environ.get("MC_SCYLLA_KEYSPACE", "message_committer")
    )
    return p


def _opener(args: argparse.Namespace, clock: ManualClock) -> tuple[Opener, bool]:
    """How to open the backend (its time following ``clock``), and whether each
    seed gets a fresh one."""
    if args.backend == "memory":

        async def memory() -> Backend:
            return open_memory_backend(clock=clock)

        return memory, True
    if args.backend == "redis":
        if not args.redis_url:
            raise SystemExit("fault-campaign: --redis-url (or MC_REDIS_URL) is required")
        from backends.redis import open_link, open_redis_backend
        from backends.redis.deployment import initialise

        prefix = f"mc-campaign-{uuid.uuid4().hex[:8]}"

        async def redis() -> Backend:
            link = open_link(args.redis_url)
            try:
                await initialise(link, prefix, 8)
            finally:
                await link.close()
            return await open_redis_backend(args.redis_url, prefix=prefix, test_clock=clock)

        return redis, False
    if not args.scylla_contact_points:
        raise SystemExit(
            "fault-campaign: --scylla-contact-points (or MC_SCYLLA_CONTACT_POINTS) is required"
        )
    from backends.scylla import open_scylla_backend

    async def scylla() -> Backend:
        return await open_scylla_backend(
            args.scylla_contact_points.split(","),
            port=args.scylla_port,
            keyspace=args.scylla_keyspace,
            username=os.environ.get("MC_SCYLLA_USERNAME") or None,
            password=os.environ.get("MC_SCYLLA_PASSWORD") or None,
            clock=clock,
            max_clock_skew_ms=None,  # the campaign's manual clock is far from the cluster's
        )

    return scylla, False


def _backend_faults(args: argparse.Namespace, backend: Backend) -> BackendFaults | None:
    if args.backend != "redis":
        return None
    from toolkit.campaign.redis_faults import RedisFaults

    return RedisFaults(args.redis_url, backend)


async def run_campaign(
    args: argparse.Namespace, first: int, count: int, steps: int | None
) -> tuple[int, Counter[str], int]:
    """Run the seeds; return (violations, fired fault kinds, acks checked)."""
    clock = ManualClock()
    open_backend, fresh_per_seed = _opener(args, clock)
    violations, acks = 0, 0
    fired: Counter[str] = Counter()
    shared = None if fresh_per_seed else await open_backend()
    try:
        for seed in range(first, first + count):
            backend = shared or await open_backend()
            result = await run_scenario(
                backend, seed, steps, clock=clock, faults=_backend_faults(args, backend)
            )
            if backend is not shared:
                await backend.close()
            fired.update(result.fired)
            acks += result.acks
            for line in result.violations:
                print(f"VIOLATION {line}", flush=True)
            violations += len(result.violations)
    finally:
        if shared is not None:
            await shared.close()
    return violations, fired, acks


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.seeds < 1:
        raise SystemExit("fault-campaign: --seeds must be at least 1")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    started = time.monotonic()
    violations, fired, acks = asyncio.run(
        run_campaign(args, args.first_seed, args.seeds, args.steps)
    )
    elapsed = time.monotonic() - started
    print(
        f"backend {args.backend}: seeds {args.first_seed}..{args.first_seed + args.seeds - 1}"
        f" in {elapsed:.1f}s, {acks} ACKs checked"
    )
    print("faults fired:")
    for kind, n in sorted(fired.items()):
        print(f"  {kind:<45} {n:>7}")
    print(f"invariant violations: {violations}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
