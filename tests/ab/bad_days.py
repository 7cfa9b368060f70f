"""``python -m tests.ab.bad_days [OLD_REV]``: the bad days of issue 11, A/B.

Checks ``OLD_REV`` (default 148ccc3, release 1's storage code) out beside this
tree with its own venv, runs every probe against the old tree and then this
one, and prints one row per defect: whether the promise held on each tree and
what was seen. Exit 0 only when every probe FAILS on the old tree (the defect
shows) and PASSES on this one; 1 otherwise; 2 when the harness itself could
not run. Bounded: every wait has a timeout, a whole run takes a few minutes
(plus a first-time venv build of the old tree).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.ab import mutation, probes_ops, probes_redis, probes_round2
from tests.ab.parts import Outcome, ProbeError, Tree, tool
from tests.ab.trees import current, old_tree, remove_old_tree

DEFAULT_OLD = "148ccc3"


@dataclass(frozen=True, slots=True)
class Probe:
    key: str
    defect: str
    run: Callable[[Tree, Path], Outcome]


PROBES: tuple[Probe, ...] = (
    Probe("1", "poison intent (undecodable, oldest)", probes_redis.poison_intent),
    Probe("2", "fast clock +3d rewrites an ACK (Redis)", probes_redis.fast_clock_redis),
    Probe("2s", "fast clock +3d rewrites an ACK (Scylla)", probes_ops.fast_clock_scylla),
    Probe("3", "retention deletes an unfinished record", probes_redis.retention_vs_unfinished),
    Probe("3c", "retention < idempotency window accepted", probes_ops.short_retention_config),
    Probe("4", "recovery stalls behind a failing intent", probes_redis.recovery_stalls),
    Probe("5e", "evicting Redis (allkeys-lru) served", probes_ops.evicting_redis),
    Probe("5w", "FLUSHALL under a running server", probes_ops.wiped_redis),
    Probe("6", "Scylla LWT default LOCAL_SERIAL", probes_ops.serial_default),
    Probe("7", "fake-ACK mutant survives the tests", mutation.fake_ack_mutant),
    # issue 24, bad days second round
    Probe(
        "r2-1", "FLUSHALL + migrate again = new deployment", probes_round2.wiped_and_migrated_again
    ),
    Probe(
        "r2-2",
        "eviction set at run time: Commit still ACKed",
        probes_round2.eviction_set_at_run_time,
    ),
    Probe(
        "r2-3", "Scylla clock jumps 8d after open: re-reserve", probes_round2.clock_jumps_after_open
    ),
    Probe(
        "r2-4", "Redis replica 8d ahead: ACK time its own", probes_round2.ack_time_of_a_fast_replica
    ),
    Probe("r2-5", "a 100k-deep JSON intent fails every scan", probes_round2.nested_json_intent),
    Probe("r2-6", "orphaned queue members are never removed", probes_round2.orphaned_queue_members),
    Probe("r2-7", "a quarantined intent can never end", probes_round2.quarantine_has_an_end),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    text: str  # PASS, FAIL or ERROR
    evidence: str
    seconds: float


def _verdict(probe: Probe, tree: Tree, work: Path) -> Verdict:
    started = time.monotonic()
    try:
        outcome = probe.run(tree, work)
    except ProbeError as exc:
        return Verdict("ERROR", str(exc), time.monotonic() - started)
    except Exception as exc:  # a harness bug: show it, keep going with the others
        traceback.print_exc(file=sys.stderr)
        return Verdict("ERROR", f"{type(exc).__name__}: {exc}", time.monotonic() - started)
    text = "PASS" if outcome.held else "FAIL"
    return Verdict(text, outcome.evidence, time.monotonic() - started)


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Cells padded to ``widths``; the last cell (the evidence) as it is."""
    padded = [c.ljust(w) for c, w in zip(cells, widths, strict=False)]
    return " | ".join([*padded, *cells[len(widths) :]]).rstrip()


def print_table(rows: list[tuple[Probe, Verdict, Verdict]]) -> None:
    head = ("#", "defect", "old", "new", "evidence (old || new)")
    body = [
        (p.key, p.defect, o.text, n.text, f"old: {o.evidence} || new: {n.evidence}")
        for p, o, n in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(4)]
    print(_row(head, widths))
    print(_row(["-" * w for w in widths] + ["-" * 21], widths))
    for cells in body:
        print(_row(cells, widths))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/ab-bad-days.sh", description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    parser.add_argument("old_rev", nargs="?", default=DEFAULT_OLD, help="the old revision")
    parser.add_argument("--only", default="", help="comma-separated probe keys, e.g. 1,5w")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mc-ab",
                        help="old tree, venv and probe data (default /tmp/mc-ab)")  # fmt: skip
    parser.add_argument("--fresh", action="store_true", help="rebuild the old tree's venv")
    parser.add_argument("--no-keep", action="store_true",
                        help="remove the old worktree afterwards (rebuilt next run)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [p for p in PROBES if not args.only or p.key in args.only.split(",")]
    if not chosen:
        print("no such probe; keys: " + ", ".join(p.key for p in PROBES), file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        for name in ("grpcurl", "grpc-health-probe"):
            tool(name)
        if shutil.which("faketime") is None:
            raise ProbeError("faketime is not installed (apt-get install -y faketime)")
        new = current()
        print(f"preparing {args.old_rev} in {args.workdir}/trees ...", flush=True)
        old = old_tree(args.old_rev, args.workdir, fresh=args.fresh)
    except ProbeError as exc:
        print(f"ab-bad-days: {exc}", file=sys.stderr)
        return 2
    runs = args.workdir / "runs" / time.strftime("%Y%m%d-%H%M%S")
    rows: list[tuple[Probe, Verdict, Verdict]] = []
    try:
        for probe in chosen:
            verdicts = []
            for side, tree in (("old", old), ("new", new)):
                verdict = _verdict(probe, tree, runs / probe.key / side)
                print(f"  probe {probe.key} {side}: {verdict.text} ({verdict.seconds:.1f}s)",
                      flush=True)  # fmt: skip
                verdicts.append(verdict)
            rows.append((probe, verdicts[0], verdicts[1]))
    finally:
        if args.no_keep:
            remove_old_tree(old)
    print()
    print(f"old = {old.label} at {old.root}; new = this tree ({new.root})")
    print_table(rows)
    good = all(o.text == "FAIL" and n.text == "PASS" for _, o, n in rows)
    print(f"\n{'OK' if good else 'NOT OK'}: {len(rows)} probes in "
          f"{time.monotonic() - started:.0f}s; logs and data under {runs}")  # fmt: skip
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
