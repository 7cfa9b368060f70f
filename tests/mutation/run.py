"""Apply the hand-made mutants one by one and report which test kills each.

    python -m tests.mutation.run lua                 # every Lua mutant, Redis subset
    python -m tests.mutation.run cql                 # CQL mutants (needs MC_TEST_CQL_CONTACT)
    python -m tests.mutation.run python              # the CI's domain/memory mutants
    python -m tests.mutation.run lua --only ID,ID --selection tests/redis -m redis

The selection is first run once without a mutant: when it fails (a backend
not ported yet, a broken test), no verdict is possible and the command stops
with exit code 2. Then each mutant runs ``pytest -x -p tests.mutation.plugin``
on its kind's selection (``catalogue.SELECTIONS``) in a fresh process; the
first failing test is the killer. One line per mutant, then a summary line;
the exit code is 0 only when every mutant was killed (a timeout counts as a
kill, and is shown). Lua mutants share one redis-server this command starts (or
``MC_TEST_REDIS_URL``); CQL mutants use the node of ``MC_TEST_CQL_CONTACT``
(starting a JVM per mutant would take minutes each).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.mutation.catalogue import ALL, SELECTIONS
from tests.mutation.hook import Kind, Mutant

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 900.0
_SUMMARY_RE = re.compile(r"^(FAILED|ERROR) (\S+)")


@dataclass(frozen=True, slots=True)
class Outcome:
    id: str
    kind: str
    promise: str
    verdict: str  # killed | survived | timeout | stale | invalid | error
    seconds: float
    killer: str
    what: str


def pytest_command(selection: Sequence[str]) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-p", "tests.mutation.plugin", "-p", "no:cacheprovider",
        "-x", "-q", "-rfE", "--no-header", *selection,
    ]  # fmt: skip


def run_one(
    mutant: Mutant,
    selection: Sequence[str],
    env: dict[str, str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Outcome:
    """Run ``selection`` with ``mutant`` applied, in a fresh process."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            pytest_command(selection),
            cwd=ROOT,
            env={**env, "MC_MUTANT": mutant.id},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _outcome(mutant, "timeout", started, f"(no verdict in {timeout_s:.0f}s)")
    out = done.stdout + done.stderr
    if done.returncode == 0:
        return _outcome(mutant, "survived", started, "")
    if done.returncode == 1:
        killers = [m.group(2) for line in out.splitlines() if (m := _SUMMARY_RE.match(line))]
        return _outcome(mutant, "killed", started, killers[0] if killers else "(no test named)")
    if "is stale" in out:
        return _outcome(mutant, "stale", started, _last_error(out))
    if "is invalid" in out:
        return _outcome(mutant, "invalid", started, _last_error(out))
    return _outcome(mutant, "error", started, f"pytest exit {done.returncode}: {_last_error(out)}")


def baseline(
    selection: Sequence[str], env: dict[str, str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[bool, str]:
    """Run ``selection`` without a mutant: (passed, the last lines of its output)."""
    clean = {k: v for k, v in env.items() if k != "MC_MUTANT"}
    try:
        done = subprocess.run(
            pytest_command(selection), cwd=ROOT, env=clean, capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"no verdict in {timeout_s:.0f}s"
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
    return done.returncode == 0, tail


def _last_error(out: str) -> str:
    lines = [line for line in out.splitlines() if "ERROR" in line or "Error" in line]
    return (lines[-1] if lines else out.strip().splitlines()[-1] if out.strip() else "")[:300]


def _outcome(mutant: Mutant, verdict: str, started: float, killer: str) -> Outcome:
    seconds = round(time.monotonic() - started, 1)
    return Outcome(mutant.id, mutant.kind, mutant.promise, verdict, seconds, killer, mutant.what)


@contextlib.contextmanager
def servers_for(kind: Kind) -> Iterator[dict[str, str]]:
    """The environment the kind's tests need: one shared redis-server for Lua."""
    env = dict(os.environ)
    if kind == "lua" and not env.get("MC_TEST_REDIS_URL"):
        from tests.servers.redis_server import RedisServer, initialise_now

        server = RedisServer()
        server.start()
        try:
            initialise_now(server.url)
            env["MC_TEST_REDIS_URL"] = server.url
            yield env
        finally:
            server.close()
        return
    if kind == "cql" and not env.get("MC_TEST_CQL_CONTACT"):
        raise SystemExit(
            "CQL mutants need a running node: MC_TEST_CQL_CONTACT=127.0.0.1:<port>"
            " (the shared development node, or deploy/cassandra/cassandra_node.py start)"
        )
    yield env


def markdown(outcomes: Sequence[Outcome]) -> str:
    """The killed-by table: mutation, what it breaks, verdict, the test that kills it."""
    lines = ["| mutant | breaks | mutation | verdict | killed by |", "|---|---|---|---|---|"]
    for o in outcomes:
        killer = f"`{o.killer}`" if o.killer else ""
        lines.append(f"| `{o.id}` | {o.promise} | {o.what} | {o.verdict} | {killer} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.run", description=__doc__)
    parser.add_argument("kind", choices=sorted(SELECTIONS))
    parser.add_argument("--only", default="", help="comma-separated mutant ids")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per mutant, s")
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    parser.add_argument(
        "--markdown", action="store_true", help="end with the killed-by table (docs/mutation.md)"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without a mutant")
    parser.add_argument(
        "--selection", nargs=argparse.REMAINDER, help="pytest arguments instead of the default"
    )
    args = parser.parse_args(argv)
    kind: Kind = args.kind
    wanted = {i for i in args.only.split(",") if i}
    mutants = [m for m in ALL if m.kind == kind and (not wanted or m.id in wanted)]
    unknown = wanted - {m.id for m in mutants}
    if unknown:
        parser.error(f"no {kind} mutant(s): {', '.join(sorted(unknown))}")
    selection = args.selection or list(SELECTIONS[kind])
    outcomes: list[Outcome] = []
    print(f"{len(mutants)} {kind} mutant(s), each against: {' '.join(selection)}", flush=True)
    with servers_for(kind) as env:
        if not args.no_baseline:
            passed, tail = baseline(selection, env, args.timeout)
            if not passed:
                print(f"the selection fails without any mutant; no verdict possible:\n{tail}")
                return 2
            print("baseline (no mutant): passed", flush=True)
        for mutant in mutants:
            outcome = run_one(mutant, selection, env, args.timeout)
            outcomes.append(outcome)
            print(
                f"{outcome.verdict:<8} {outcome.seconds:6.1f}s  {mutant.id:<40} {outcome.killer}",
                flush=True,
            )
    counts = {v: sum(1 for o in outcomes if o.verdict == v) for v in _VERDICTS}
    print(f"{kind} mutants: {len(outcomes)}, " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    if args.markdown:
        print(markdown(outcomes))
    return 0 if all(o.verdict in ("killed", "timeout") for o in outcomes) else 1


_VERDICTS = ("killed", "timeout", "survived", "stale", "invalid", "error")

if __name__ == "__main__":
    raise SystemExit(main())
