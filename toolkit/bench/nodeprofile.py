"""Where a CQL node's CPU goes, from a Java Flight Recorder file of the node.

    jcmd <node pid> JFR.start name=p duration=60s filename=commit.jfr settings=profile
    ... run the load (for example ``bench --backend scylla --workloads fresh``) ...
    python -m toolkit.bench.nodeprofile commit.jfr --ops 11522 \\
        --floor floor.jfr --floor-ops 54000

Reads the recording's execution samples through the JDK's own ``jfr print``
(``--json --stack-depth 64 --events jdk.ExecutionSample``), puts each sample in
the first category whose rule matches its thread or its frames, and prints each
category's share. With ``--ops`` (the requests the load completed while the
recording ran) it prints samples per op; with a second recording of the
cheapest conditional write (``--floor``, ``--floor-ops``) it prints every
category in *floors*: samples per op over the floor's samples per op overall.
A sample is a Java thread seen running, so the figures are the node's Java CPU
(garbage collection and the JIT are not sampled).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """A category: a sample belongs to it if its thread name starts with one of
    ``threads`` or one of its frames contains one of ``frames``."""

    name: str
    threads: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()

    def matches(self, thread: str, stack: Sequence[str]) -> bool:
        if any(thread.startswith(t) for t in self.threads):
            return True
        return any(f in frame for frame in stack for f in self.frames)


RULES: tuple[Rule, ...] = (
    Rule("compaction", threads=("CompactionExecutor",)),
    Rule("memtable flush", threads=("MemtableFlushWriter", "PerDiskMemtableFlushWriter")),
    Rule("network I/O (netty)", threads=("epollEventLoopGroup", "nioEventLoopGroup")),
    Rule(
        "paxos state (system.paxos and its index)",
        frames=("SystemKeyspace.savePaxos", "SystemKeyspace.loadPaxos", "SecondaryIndexManager"),
    ),
    Rule("paxos commit: the data applied", frames=("PaxosState.applyCommit",)),
    Rule("reads (conditions and plain)", frames=("ReadCommand.",)),
    Rule("paxos, the rest (ballots, callbacks)", frames=("Paxos",)),
    Rule("plain writes applied", frames=("Mutation.apply", "Keyspace.apply")),
    Rule(
        "CQL requests (decode, statements, encode)",
        frames=("Dispatcher.", "QueryProcessor.", "Message$", "Envelope"),
    ),
)
OTHER = "other"


def frame_names(event: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The sampled thread's name and the frames, innermost first, as ``Class.method``."""
    values = event["values"]
    thread = values.get("sampledThread") or {}
    name = thread.get("javaName") or thread.get("osName") or ""
    frames = (values.get("stackTrace") or {}).get("frames") or []
    stack = [
        f"{f['method']['type']['name'].rsplit('/', 1)[-1]}.{f['method']['name']}" for f in frames
    ]
    return name, stack


def categorise(events: Iterable[Mapping[str, Any]], rules: Sequence[Rule] = RULES) -> Counter[str]:
    """Samples per category (the first rule that matches; else ``other``)."""
    counts: Counter[str] = Counter()
    for event in events:
        thread, stack = frame_names(event)
        counts[next((r.name for r in rules if r.matches(thread, stack)), OTHER)] += 1
    return counts


def report(
    counts: Counter[str],
    *,
    ops: int | None = None,
    floor: Counter[str] | None = None,
    floor_ops: int | None = None,
) -> list[str]:
    """The lines printed: share of every category, per op and in floors when known."""
    total = sum(counts.values())
    if total == 0:
        return ["no execution samples in the recording (was the node busy while it ran?)"]
    lines = [f"{total} samples" + (f", {total / ops:.4f} per op" if ops else "")]
    in_floors: dict[str, str] = {}  # per category, when both loads' op counts are known
    if ops and floor and floor_ops:
        unit = sum(floor.values()) / floor_ops  # the floor's samples per op
        lines.append(f"the floor: {unit:.4f} samples per op; this load: "
                     f"{total / ops / unit:.2f} floors per op")  # fmt: skip
        in_floors = {
            name: f"  ({n / ops / unit:.2f} floors; the floor's own: "
            f"{floor[name] / floor_ops / unit:.2f})"
            for name, n in counts.items()
        }
    for name, n in counts.most_common():
        lines.append(f"{100 * n / total:5.1f} %  {name}{in_floors.get(name, '')}")
    return lines


def read_samples(path: str) -> list[dict[str, Any]]:
    """The execution samples of a JFR file, through the JDK's ``jfr`` tool."""
    try:
        done = subprocess.run(
            ["jfr", "print", "--json", "--stack-depth", "64",
             "--events", "jdk.ExecutionSample", path],
            capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise SystemExit("jfr not found: it ships with the JDK (Java 17 or later)") from exc
    if done.returncode != 0:
        raise SystemExit(f"jfr print failed on {path}: {done.stderr.strip()[-500:]}")
    events: list[dict[str, Any]] = json.loads(done.stdout)["recording"]["events"]
    return events


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.bench.nodeprofile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("recording", help="a .jfr file of the CQL node under the load")
    parser.add_argument("--ops", type=int, help="requests the load completed while it recorded")
    parser.add_argument("--floor", help="a .jfr file of the node under the floor's load")
    parser.add_argument("--floor-ops", type=int, help="requests of the floor's load")
    args = parser.parse_args(argv)
    if (args.floor is None) != (args.floor_ops is None):
        parser.error("--floor and --floor-ops go together")
    for value, flag in ((args.ops, "--ops"), (args.floor_ops, "--floor-ops")):
        if value is not None and value <= 0:
            parser.error(f"{flag} must be a positive count")
    floor = categorise(read_samples(args.floor)) if args.floor else None
    counts = categorise(read_samples(args.recording))
    for line in report(counts, ops=args.ops, floor=floor, floor_ops=args.floor_ops):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
