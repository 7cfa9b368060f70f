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

``--summary FILE.html`` (or ``.png``) also writes a one-page summary of what
fired and what was checked (``toolkit.summary``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from backends.memory import open_memory_backend
from service.domain.ports import Backend, ManualClock
from toolkit.campaign.scenario import BackendFaults, run_scenario
from toolkit.summary import Check, RunSummary, SummaryError, write_summary

Opener = Callable[[], Awaitable[Backend]]
INVARIANTS = {
    "1": "1. every ACK is in history once, at its seq, with its whole record, and in the outbox",
    "2": "2. no sequence number of a conversation is given to two messages",
    "3": "3. every ACK for one key is identical",
    "4": "4. a key reused with a different request is never ACKed",
    "5": "5. recovery with faults off finishes every key ever sent (quarantine released)",
    "6": "6. no history record exists without its intent",
}
"""DESIGN section 7, as toolkit.campaign.invariants numbers its violation lines."""
_VIOLATION = re.compile(r"^seed (-?\d+): (\d+):")


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
    p.add_argument(
        "--summary",
        type=Path,
        default=None,
        metavar="FILE.html|FILE.png",
        help="also write a summary of what fired and what was checked",
    )
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
    args: argparse.Namespace,
    first: int,
    count: int,
    steps: int | None,
    lines: list[str] | None = None,
) -> tuple[int, Counter[str], int]:
    """Run the seeds; return (violations, fired fault kinds, acks checked).

    Each violation line is printed and, when ``lines`` is given, added to it."""
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
                if lines is not None:
                    lines.append(line)
            violations += len(result.violations)
    finally:
        if shared is not None:
            await shared.close()
    return violations, fired, acks


def summarise(
    args: argparse.Namespace, fired: Counter[str], lines: list[str], acks: int, elapsed: float
) -> RunSummary:
    """What this campaign fired and checked, as plain data for toolkit.summary."""
    per_invariant: Counter[str] = Counter()
    failing: list[str] = []
    for line in lines:
        match = _VIOLATION.match(line)
        number = match.group(2) if match else "?"
        per_invariant[number if number in INVARIANTS else "?"] += 1
        seed = f"seed {match.group(1)}" if match else "?"
        if seed not in failing:
            failing.append(seed)
    checks = [Check(text, per_invariant[n]) for n, text in INVARIANTS.items()]
    if per_invariant["?"]:
        checks.append(Check("violations of no numbered invariant", per_invariant["?"]))
    last = args.first_seed + args.seeds - 1
    return RunSummary(
        title=f"fault campaign on {args.backend}",
        fired=dict(fired),
        checks=checks,
        facts={
            "backend": args.backend,
            "seeds": f"{args.first_seed}..{last} ({args.seeds})",
            "steps per scenario": str(args.steps) if args.steps is not None else "drawn (10-40)",
            "ACKs checked": str(acks),
            "elapsed": f"{elapsed:.1f} s",
            "replay one seed": f"--first-seed S --seeds 1 --backend {args.backend}",
        },
        violations=lines,
        failing=failing,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.seeds < 1:
        raise SystemExit("fault-campaign: --seeds must be at least 1")
    if args.summary is not None and args.summary.suffix.lower() not in (".html", ".png"):
        raise SystemExit("fault-campaign: --summary is FILE.html or FILE.png")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    started = time.monotonic()
    lines: list[str] = []
    violations, fired, acks = asyncio.run(
        run_campaign(args, args.first_seed, args.seeds, args.steps, lines)
    )
    elapsed = time.monotonic() - started
    print(
        f"backend {args.backend}: seeds {args.first_seed}..{args.first_seed + args.seeds - 1}"
        f" in {elapsed:.1f}s, {acks} ACKs checked"
    )
    print("faults fired:")
    for kind, n in sorted(fired.items()):
        print(f"  {kind:<45} {n:>7}")
    if args.summary is not None:
        try:
            write_summary(summarise(args, fired, lines, acks, elapsed), args.summary)
        except SummaryError as exc:
            print(f"fault-campaign: summary not written: {exc}", file=sys.stderr)
            return 2
        print(f"summary written to {args.summary}")
    print(f"invariant violations: {violations}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
