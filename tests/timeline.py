"""With ``MC_TEST_TIMELINE=FILE``, every test appends one line to FILE: the worker,
the wall-clock start and end of its setup, call and teardown, and its node id. The
suite's wall time is the slowest worker's; ``python -m tests.timeline FILE`` prints
where each worker spent it (busy, idle, by group) and the longest tests."""

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    path = os.environ.get("MC_TEST_TIMELINE")
    start = time.time()
    yield
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        line = json.dumps({"w": worker, "s": start, "e": time.time(), "id": item.nodeid})
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


@dataclass(frozen=True)
class Row:
    worker: str
    start: float
    end: float
    nodeid: str

    @property
    def secs(self) -> float:
        return self.end - self.start

    @property
    def group(self) -> str:
        """``cql``/``cql-cluster``, ``module:FILE`` (a module-scoped fixture) or the suite
        folder."""
        if "@" in self.nodeid:
            group = self.nodeid.rsplit("@", 1)[1]
            return group if group.startswith("cql") else "module:" + group.split("/")[-1]
        return self.nodeid.split("::", 1)[0].split("/")[1]


def load(path: str) -> list[Row]:
    with open(path, encoding="utf-8") as lines:
        raw = [json.loads(line) for line in lines if line.strip()]
    return [Row(str(r["w"]), float(r["s"]), float(r["e"]), str(r["id"])) for r in raw]


def summarise(rows: list[Row], top: int = 25) -> None:
    if not rows:
        print("no tests recorded")
        return
    t0 = min(r.start for r in rows)
    t1 = max(r.end for r in rows)
    print(f"{len(rows)} tests, {t1 - t0:.0f} s from the first start to the last end")
    by_worker: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_worker[r.worker].append(r)
    for worker, items in sorted(by_worker.items()):
        busy = sum(r.secs for r in items)
        end = max(r.end for r in items)
        groups: dict[str, float] = defaultdict(float)
        for r in items:
            groups[r.group] += r.secs
        print(f"\n{worker}: {len(items)} tests, busy {busy:.0f} s, ends at +{end - t0:.0f} s")
        for name, secs in sorted(groups.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {secs:7.1f} s  {name}")
    print(f"\nlongest {top}:")
    for r in sorted(rows, key=lambda r: -r.secs)[:top]:
        print(f"  {r.secs:6.1f} s  {r.worker}  +{r.start - t0:4.0f}  {r.nodeid}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.timeline",
        description="Where a test run's wall time went (the file MC_TEST_TIMELINE named).",
    )
    parser.add_argument("file", help="the timeline a run wrote (JSON lines)")
    parser.add_argument("top", nargs="?", type=int, default=25, help="longest tests to list [25]")
    args = parser.parse_args(argv)
    try:
        rows = load(args.file)
    except OSError as exc:
        parser.error(f"cannot read {args.file}: {exc.strerror}")
    if not rows:
        parser.error(f"{args.file} holds no tests")
    summarise(rows, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
