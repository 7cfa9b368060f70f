"""The figures of a mutmut run, and every survivor next to the reason it is harmless.

    .venv/bin/python -m tests.mutation.mutmut_report              # figures + survivors
    .venv/bin/python -m tests.mutation.mutmut_report --markdown   # the table of docs/mutation.md

Reads mutmut's own result files (``mutants/**/*.py.meta``) after ``mutmut
run`` (see docs/mutation.md) and ``mutmut_survivors.txt`` beside this file:
one ``<mutant name> <reason>`` per line, for every mutant that survives on
purpose. Exit code 1 when a survivor has no reason (a test is missing or the
reason is) or a listed mutant no longer survives (the list is stale).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REASONS = Path(__file__).with_name("mutmut_survivors.txt")
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "caught by type check",
    None: "not checked",
}


def results(mutants_dir: Path) -> dict[str, str]:
    """Mutant name -> status, from every ``*.py.meta`` mutmut wrote."""
    found: dict[str, str] = {}
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        data = json.loads(meta.read_text(encoding="utf-8"))
        for name, code in data.get("exit_code_by_key", {}).items():
            found[name] = STATUS.get(code, "suspicious")
    return found


def reasons(path: Path = REASONS) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            found[name] = reason.strip()
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.mutmut_report")
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    status = results(args.mutants)
    if not status:
        print(f"no mutmut results under {args.mutants}: run mutmut first (docs/mutation.md)")
        return 1
    why = reasons()
    counts = Counter(status.values())
    print(
        f"mutants: {len(status)}, "
        + ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
    )
    survivors = sorted(n for n, s in status.items() if s in ("survived", "no tests"))
    unexplained = [n for n in survivors if n not in why]
    stale = sorted(n for n in why if status.get(n) not in ("survived", "no tests"))
    if args.markdown:
        print("\n| mutant | status | why it is harmless |\n|---|---|---|")
        for name in survivors:
            print(f"| `{name}` | {status[name]} | {why.get(name, '**UNEXPLAINED**')} |")
    else:
        for name in unexplained:
            print(f"UNEXPLAINED {status[name]}: {name}")
    for name in stale:
        print(f"STALE (no longer survives): {name}")
    print(f"survivors: {len(survivors)}, explained {len(survivors) - len(unexplained)}")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
