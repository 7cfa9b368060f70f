"""``message-committer client-campaign --processes``: the process mode.

Every device is a real OS process over its own SQLite file (``synchronous=FULL``),
killed with SIGKILL at each client fault point and at random moments; two
devices per user; refusals (non-member, idempotency conflict, oversize);
membership changes; server kills and stalls (SIGSTOP longer than the ACK and
PONG timeouts); corrupt pages; and, with ``--long-outage-seeds N``, N more
seeds whose server is down for ``--outage`` seconds (more than a minute) with
sends pending. See ``proc_scenario`` for the actions, ``proc_check`` for what
counts. Exits 1 on any violation, a broken seed, or a seed that did not settle
within the stated bound (``--settle`` seconds after the servers are back).

::

    message-committer client-campaign --processes --seeds 500
    message-committer client-campaign --processes --backend redis --seeds 50 \\
        --long-outage-seeds 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from client.faults import ClientPoint
from toolkit.client_campaign.proc_check import Verdict
from toolkit.client_campaign.proc_scenario import Options, run_proc_seed

PROG = "message-committer client-campaign --processes"
VIOLATIONS = ("lost", "duplicated", "wrongly_confirmed", "wrong_refusal", "stuck", "phantom")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="the client campaign's process mode")
    p.add_argument("--backend", choices=("memory", "redis"), default="memory")
    p.add_argument("--seeds", type=int, default=100, help="how many seeds [100]")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed [0]")
    p.add_argument("--steps", type=int, default=20, help="actions per seed [20]")
    p.add_argument("--parallel", type=int, default=1, help="seeds at once (4 devices each) [1]")
    p.add_argument("--settle", type=float, default=30.0, help="the stated bound, seconds [30]")
    p.add_argument("--long-outage-seeds", type=int, default=0, help="extra long-outage seeds")
    p.add_argument("--outage", type=float, default=65.0, help="long outage, seconds [65]")
    p.add_argument("--no-stalls", action="store_true", help="no SIGSTOP of the server")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if not (1 <= args.parallel <= 8 and args.seeds >= 1 and args.long_outage_seeds >= 0):
        print(f"{PROG}: --parallel 1-8, --seeds >= 1", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.CRITICAL)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # inherited by every child
    options = Options(
        backend=args.backend, steps=args.steps, settle_s=args.settle, stalls=not args.no_stalls
    )
    started = time.monotonic()
    verdicts = asyncio.run(_run(args, options))
    return report(verdicts, time.monotonic() - started, args)


async def _run(args: argparse.Namespace, options: Options) -> list[Verdict]:
    limit = asyncio.Semaphore(args.parallel)
    with tempfile.TemporaryDirectory(prefix="mc-client-procs-") as tmp:

        async def one(seed: int, opts: Options, gate: asyncio.Semaphore | None) -> Verdict:
            if gate is None:
                verdict = await run_proc_seed(seed, opts, Path(tmp) / f"seed-{seed}")
            else:
                async with gate:
                    verdict = await run_proc_seed(seed, opts, Path(tmp) / f"seed-{seed}")
            if not verdict.ok:
                print(f"seed {seed}: " + "; ".join(verdict.problems[:5]), flush=True)
            return verdict

        first = args.first_seed
        regular = [one(s, options, limit) for s in range(first, first + args.seeds)]
        long_options = replace(options, outage_s=args.outage)
        extra = range(first + args.seeds, first + args.seeds + args.long_outage_seeds)
        outages = [one(s, long_options, None) for s in extra]  # mostly idle: all at once
        return list(await asyncio.gather(*regular, *outages))


def report(verdicts: list[Verdict], seconds: float, args: argparse.Namespace) -> int:
    fired: Counter[str] = Counter()
    scheduled: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for v in verdicts:
        fired.update(v.fired)
        scheduled.update(v.scheduled)
        outcomes.update(v.outcomes)
    settle = [v.settled_in_s for v in verdicts if v.settled_in_s >= 0]
    long_seeds = args.long_outage_seeds
    print(
        f"backend: {args.backend}  seeds: {len(verdicts)} ({long_seeds} with a"
        f" {args.outage:.0f} s outage)  devices per seed: 4 (2 users x 2)  in {seconds:.0f} s"
    )
    print(f"sends persisted: {sum(v.sends for v in verdicts)}  outcomes: " + _counts(outcomes))
    print("fired: " + _counts(fired))
    print("scheduled: " + _counts(scheduled))
    kills = {k for k in fired if k.startswith("kill at C-")}
    never = [p.value for p in ClientPoint if f"kill at {p.value}" not in kills]
    if never:
        print("client fault points that never fired: " + ", ".join(never))
    if settle:
        print(
            f"settled within the bound of {args.settle:.0f} s after the servers were back:"
            f" {len(settle)}/{len(verdicts)} seeds, slowest {max(settle):.1f} s"
        )
    slow = sorted(v.seconds for v in verdicts)
    print(f"seed seconds: median {slow[len(slow) // 2]:.1f}, slowest {slow[-1]:.1f}")
    totals = {k: sum(getattr(v, k) for v in verdicts) for k in VIOLATIONS}
    unsettled = sum(1 for v in verdicts if v.settled_in_s < 0 and not v.broken)
    broken = sum(1 for v in verdicts if v.broken)
    print(
        "  ".join(f"{k.replace('_', ' ')}: {n}" for k, n in totals.items())
        + f"  reported losses: {sum(v.reported_lost for v in verdicts)}"
        + f"  unsettled seeds: {unsettled}  broken seeds: {broken}"
    )
    return 1 if any(totals.values()) or unsettled or broken else 0


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"
