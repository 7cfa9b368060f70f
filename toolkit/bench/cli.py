"""``message-committer bench``: drive the service over real gRPC and report figures.

    message-committer bench --backend {memory,redis,scylla,all} [--quick] [--json PATH]
        [--event-loop auto|asyncio|uvloop] [--compare-loops] [--plot FILE.png]
    message-committer bench --plot FILE.png --from-json PATH     (draw a saved result)

For each backend: start the real server in this process (or drive
``--target``), create the conversations, warm up, then run the floors and
workloads one after another, each for ``--duration`` seconds or
``--requests`` calls, whichever ends first, from ``--clients`` processes with
``--concurrency`` streams in all. Prints one table per backend, the ratios
and the targets, and writes everything to ``--json``; ``--plot`` draws
throughput and latency per phase and backend (``toolkit.bench.plot``).
``--event-loop`` picks the bench process's loop (the in-process server's),
like ``serve``'s ``MC_EVENT_LOOP``; ``--compare-loops`` runs every round on
asyncio and on uvloop in turn and reports uvloop/asyncio
(``toolkit.bench.loops``). Exit code 0 when the run completed (1 with
``--check`` when a target failed), 1 when the bench could not run, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from service import eventloop
from service.config import EVENT_LOOPS, StartupError, parse_replicas
from toolkit.bench import loops
from toolkit.bench.document import to_json
from toolkit.bench.driver import BenchError, ClientPool
from toolkit.bench.environment import BackendAddress, Environment, run_tag
from toolkit.bench.report import BackendReport, backend_text, machine, merge_reports
from toolkit.bench.runner import BackendBench, Progress
from toolkit.bench.targets import check_targets, targets_text
from toolkit.bench.workloads import Kind, Population

BACKENDS = ("memory", "redis", "scylla")
ALL_WORKLOADS = [k.value for k in Kind if k is not Kind.GRPC_FLOOR]


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="message-committer bench",
        description="Throughput, latency and cost of commits over real gRPC, with floors.",
    )
    p.add_argument(
        "--backend",
        default="",
        help="memory, redis, scylla, a comma-separated list of them, or all (run in turn)",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: ~0.5 s per phase")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), metavar="PATH")
    p.add_argument("--target", default="", metavar="HOST:PORT", help="drive this server")
    p.add_argument("--metrics-url", default="", help="the target's /metrics (for cost figures)")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent streams in all")
    p.add_argument("--clients", type=int, default=2, help="client processes")
    p.add_argument("--duration", type=float, default=None, help="seconds per phase and round (5)")
    p.add_argument("--requests", type=int, default=0, help="calls per phase (0: time only)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of every phase (3)")
    p.add_argument(
        "--serial-commits", type=int, default=None, help="calls of fresh-serial (200; 0: skip)"
    )
    p.add_argument(
        "--sustained",
        type=int,
        default=None,
        help="fresh commits of the sustained phase, relay running (100000; quick 2000; 0: skip)",
    )
    p.add_argument(
        "--sustained-workload",
        choices=("fresh", "hot"),
        default="fresh",
        help="what the sustained phase sends: spread conversations, or all to the hot one",
    )
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds (2)")
    p.add_argument("--body-bytes", type=int, default=100, help="inline body size")
    p.add_argument("--conversations", type=int, default=None, help="spread conversations (1000)")
    p.add_argument("--members", type=int, default=4, help="members per spread conversation")
    p.add_argument("--hot-members", type=int, default=64, help="members of the hot conversation")
    p.add_argument(
        "--big-members", type=int, default=None, help="members of each big conversation (100000)"
    )
    p.add_argument("--big-conversations", type=int, default=2, help="big conversations")
    p.add_argument("--dup-ratio", type=float, default=0.9, help="replay share of dupmix")
    p.add_argument("--conflict-ratio", type=float, default=0.5, help="conflict share of conflict")
    p.add_argument("--page-size", type=int, default=50, help="history page size")
    p.add_argument("--workloads", default=",".join(ALL_WORKLOADS), help="comma-separated")
    p.add_argument("--no-floors", action="store_true", help="skip the in-process floors")
    p.add_argument(
        "--cql-wire",
        action="store_true",
        help="scylla: count CQL requests on the wire through a proxy process (adds a hop)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="deadline of one RPC, seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    p.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=env("MC_EVENT_LOOP", "auto"),
        help="loop of the in-process server (clients use asyncio's) [env MC_EVENT_LOOP; auto]",
    )
    p.add_argument(
        "--compare-loops",
        action="store_true",
        help="run every round on asyncio and on uvloop, alternating; report uvloop/asyncio",
    )
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="draw the figures")
    p.add_argument(
        "--from-json", type=Path, default=None, metavar="PATH", help="--plot a saved --json result"
    )
    p.add_argument("--verbose", action="store_true", help="show the server's log")
    p.add_argument("--redis-url", default=env("MC_REDIS_URL", ""), help="[env MC_REDIS_URL]")
    p.add_argument(
        "--redis-wait-replicas",
        type=parse_replicas,
        default=parse_replicas(env("MC_REDIS_WAIT_REPLICAS", "auto")),
        help="replicas an ACK waits for, as serve's MC_REDIS_WAIT_REPLICAS (auto)",
    )
    p.add_argument("--scylla-contact-points", default=env("MC_SCYLLA_CONTACT_POINTS", ""))
    p.add_argument("--scylla-port", type=int, default=int(env("MC_SCYLLA_PORT", "9042")))
    p.add_argument("--scylla-keyspace", default=env("MC_SCYLLA_KEYSPACE", ""))
    return p


def _settings(args: argparse.Namespace) -> None:
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise SystemExit("bench: --plot writes a PNG: give FILE.png")
    if args.from_json is not None:
        if args.plot is None:
            raise SystemExit("bench: --from-json needs --plot FILE.png")
        return
    if not args.backend:
        raise SystemExit("bench: --backend is required (memory, redis, scylla, a list, or all)")
    try:
        args.loop_name = eventloop.resolve(args.event_loop)[0]
        if args.compare_loops:
            eventloop.resolve("uvloop")
    except StartupError as exc:
        raise SystemExit(f"bench: {exc}") from None
    quick = args.quick
    if args.duration is None:
        args.duration = 0.5 if quick else 5.0
    if args.warmup is None:
        args.warmup = 0.3 if quick else 2.0
    if args.serial_commits is None:
        args.serial_commits = 20 if quick else 200
    if args.rounds is None:
        args.rounds = 1 if quick else 3
    if args.sustained is None:
        args.sustained = 2_000 if quick else 100_000
    if args.conversations is None:
        args.conversations = 100 if quick else 1000
    if args.big_members is None:
        args.big_members = 2_000 if quick else 100_000
    kinds = [k.strip() for k in args.workloads.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ALL_WORKLOADS]
    if unknown:
        raise SystemExit(f"bench: unknown workload(s) {', '.join(unknown)}")
    args.kinds = [Kind(k) for k in kinds]
    positive = ("concurrency", "clients", "duration", "body_bytes", "conversations", "members")
    for name in (*positive, "hot_members", "big_members", "big_conversations", "page_size",
                 "timeout", "rounds"):  # fmt: skip
        if getattr(args, name) <= 0:
            raise SystemExit(f"bench: --{name.replace('_', '-')} must be positive")
    if min(args.requests, args.warmup, args.serial_commits, args.sustained) < 0:
        raise SystemExit(
            "bench: --requests, --warmup, --serial-commits and --sustained must not be negative"
        )
    if args.clients > args.concurrency:
        raise SystemExit("bench: --clients must not exceed --concurrency")
    if not (0 <= args.dup_ratio <= 1 and 0 <= args.conflict_ratio <= 1):
        raise SystemExit("bench: ratios must be between 0 and 1")
    names = list(BACKENDS) if args.backend == "all" else args.backend.split(",")
    if not names or any(n not in BACKENDS for n in names) or len(set(names)) != len(names):
        raise SystemExit("bench: --backend must be memory, redis, scylla, a list of them, or all")
    args.backends = names
    if args.target and len(names) != 1:
        raise SystemExit("bench: --target drives one server: name its --backend")


async def _bench_backend(
    name: str, args: argparse.Namespace, env: Environment, pool: ClientPool, tag: str
) -> BackendReport:
    if args.target:
        target = await env.attach(name, args.target, args.metrics_url)
    else:
        target = await env.start(name)
    population = Population(
        tenant=f"bench-{tag}-{name}",
        spread_conversations=args.conversations,
        members=args.members,
        hot_members=args.hot_members,
        big_conversations=args.big_conversations if Kind.BIG in args.kinds else 0,
        big_members=args.big_members,
    )
    try:
        bench = BackendBench(args, target, pool, population, Progress())
        report = await bench.run()
    finally:
        try:
            await pool.reset()  # close the channels before the server goes
        finally:
            await target.close()
        gc.collect()  # the next backend must not pay for collecting this one's heap
    report.notes.append(f"{args.concurrency} streams from {args.clients} client processes")
    report.notes.append(f"server event loop: {eventloop.running_loop_name()}")
    return report


def _compare_loops(
    name: str, args: argparse.Namespace, env: Environment, pool: ClientPool, tag: str
) -> dict[str, BackendReport]:
    """Every round once per loop, taking turns; one merged report per loop."""
    one_round = argparse.Namespace(**{**vars(args), "rounds": 1})
    parts: dict[str, list[BackendReport]] = {loop: [] for loop in loops.LOOPS}
    for number in range(args.rounds):
        for loop in loops.round_order(number):
            print(f"[{name}] round {number + 1}/{args.rounds} on {loop}", file=sys.stderr)
            run = _bench_backend(name, one_round, env, pool, f"{tag}{number}{loop[:2]}")
            parts[loop].append(eventloop.run(run, loop))
    note = f"{args.rounds} runs of one round each, alternating loops (--compare-loops)"
    return {loop: merge_reports(reports, note) for loop, reports in parts.items()}


Compared = dict[str, dict[str, BackendReport]]


def _run(
    args: argparse.Namespace, backends: list[str]
) -> tuple[dict[str, BackendReport], Compared]:
    """Every backend in turn; with --compare-loops also each loop's report."""
    tag = run_tag()
    given = BackendAddress(
        redis_url=args.redis_url,
        scylla_contact_points=tuple(p for p in args.scylla_contact_points.split(",") if p),
        scylla_port=args.scylla_port,
        scylla_keyspace=args.scylla_keyspace,
        cql_wire=args.cql_wire,
    )
    env = Environment(given, tag, args.redis_wait_replicas)
    pool = ClientPool(args.clients)
    reports: dict[str, BackendReport] = {}
    compared: Compared = {}
    try:
        for name in backends:
            if args.compare_loops:
                compared[name] = _compare_loops(name, args, env, pool, tag)
                reports[name] = compared[name][args.loop_name]
            else:
                run = _bench_backend(name, args, env, pool, tag)
                reports[name] = eventloop.run(run, args.event_loop)
            env.close()  # free the CPU a throwaway redis or Cassandra would take from the next
            print("\n".join(backend_text(reports[name])), flush=True)
            if name in compared:
                print("\n".join(loops.comparison_text(name, compared[name])), flush=True)
            print(flush=True)
    finally:
        pool.close()
        env.close()
    return reports, compared


SECRET_FLAGS = ("--redis-url", "--scylla-contact-points")


def redact(argv: list[str]) -> list[str]:
    """``argv`` with the values of address flags replaced (a URL may hold a password)."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide = True
        elif arg.startswith(tuple(f + "=" for f in SECRET_FLAGS)):
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return out


def _json_settings(
    args: argparse.Namespace, argv: list[str], backends: list[str]
) -> dict[str, Any]:
    return {
        "command": " ".join(["message-committer", "bench", *redact(argv)]),
        "backends": backends,
        "quick": args.quick,
        "target": args.target or None,
        "concurrency": args.concurrency,
        "clients": args.clients,
        "duration_s": args.duration,
        "requests": args.requests,
        "rounds": args.rounds,
        "serial_commits": args.serial_commits,
        "sustained": args.sustained,
        "sustained_workload": args.sustained_workload,
        "warmup_s": args.warmup,
        "body_bytes": args.body_bytes,
        "conversations": args.conversations,
        "members": args.members,
        "hot_members": args.hot_members,
        "big_members": args.big_members,
        "big_conversations": args.big_conversations,
        "dup_ratio": args.dup_ratio,
        "conflict_ratio": args.conflict_ratio,
        "page_size": args.page_size,
        "workloads": [k.value for k in args.kinds],
        "event_loop": args.loop_name,
        "compare_loops": args.compare_loops,
        "redis_wait_replicas": args.redis_wait_replicas,
        "backend_address_given": bool(args.redis_url or args.scylla_contact_points),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        _settings(args)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.from_json is not None:
        return _plot(json.loads(args.from_json.read_text()), args.plot)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    backends: list[str] = args.backends
    settings = _json_settings(args, argv, backends)
    info = machine()
    try:
        reports, compared = _run(args, backends)
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    checks = check_targets(reports)
    print("\n".join(targets_text(checks)))
    document = to_json(settings, reports, checks, info)
    if compared:
        document["event_loops"] = {n: loops.comparison_json(c) for n, c in compared.items()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    print(f"results written to {args.json}")
    if args.plot is not None and _plot(document, args.plot):
        return 1
    failed = any(c.passed is False for c in checks)
    return 1 if args.check and failed else 0


def _plot(document: dict[str, Any], path: Path) -> int:
    from toolkit.bench.plot import PlotError, draw  # matplotlib only when asked

    try:
        draw(document, path)
    except PlotError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    print(f"figures drawn in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
