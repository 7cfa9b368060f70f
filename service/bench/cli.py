"""``message-committer bench``: drive the service over real gRPC and report figures.

    message-committer bench --backend {memory,redis,scylla,all} [--quick] [--json PATH]

For each backend: start the real server in this process (or drive
``--target``), create the conversations, warm up, then run the floors and
workloads one after another, each for ``--duration`` seconds or
``--requests`` calls, whichever ends first, from ``--clients`` processes with
``--concurrency`` streams in all. Prints one table per backend, the ratios
and the targets, and writes everything to ``--json``. Exit code 0 when the
run completed (1 with ``--check`` when a target failed), 1 when the bench
could not run, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from service.bench.driver import BenchError, ClientPool, create_population
from service.bench.environment import BackendAddress, Environment, Target, run_tag
from service.bench.floors import StorageDriver, run_ops
from service.bench.report import (
    BackendReport,
    Phase,
    Round,
    backend_text,
    check_targets,
    machine,
    targets_text,
    to_json,
)
from service.bench.workloads import DESCRIPTIONS, Job, Kind, Population
from service.domain.limits import CommitLimits

BACKENDS = ("memory", "redis", "scylla")
MAX_CALLS = 5_000_000
"""Count bound of one phase when ``--requests`` is not given."""
FLOOR_DESCRIPTIONS = {
    "storage-floor": "fresh commit through the store objects, no gRPC (same calls as the service)",
    "storage-replay": "replay through the store objects: membership read + reserve",
    "committer-floor": "MessageCommitter.commit_send in-process: no gRPC, no metrics",
}
ALL_WORKLOADS = [k.value for k in Kind if k is not Kind.GRPC_FLOOR]


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="message-committer bench",
        description="Throughput, latency and cost of commits over real gRPC, with floors.",
    )
    p.add_argument("--backend", required=True, choices=[*BACKENDS, "all"])
    p.add_argument("--quick", action="store_true", help="a smoke run: ~0.5 s per phase")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), metavar="PATH")
    p.add_argument("--target", default="", metavar="HOST:PORT", help="drive this server")
    p.add_argument("--metrics-url", default="", help="the target's /metrics (for cost figures)")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent streams in all")
    p.add_argument("--clients", type=int, default=2, help="client processes")
    p.add_argument("--duration", type=float, default=None, help="seconds per phase and round (5)")
    p.add_argument("--requests", type=int, default=0, help="calls per phase (0: time only)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of every phase (3)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds (2)")
    p.add_argument("--body-bytes", type=int, default=100, help="inline body size")
    p.add_argument("--conversations", type=int, default=None, help="spread conversations (1000)")
    p.add_argument("--members", type=int, default=4, help="members per spread conversation")
    p.add_argument("--hot-members", type=int, default=64, help="members of the hot conversation")
    p.add_argument("--dup-ratio", type=float, default=0.9, help="replay share of dupmix")
    p.add_argument("--conflict-ratio", type=float, default=0.5, help="conflict share of conflict")
    p.add_argument("--page-size", type=int, default=50, help="history page size")
    p.add_argument("--workloads", default=",".join(ALL_WORKLOADS), help="comma-separated")
    p.add_argument("--no-floors", action="store_true", help="skip the in-process floors")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline of one RPC, seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    p.add_argument("--verbose", action="store_true", help="show the server's log")
    p.add_argument("--redis-url", default=env("MC_REDIS_URL", ""), help="[env MC_REDIS_URL]")
    p.add_argument("--scylla-contact-points", default=env("MC_SCYLLA_CONTACT_POINTS", ""))
    p.add_argument("--scylla-port", type=int, default=int(env("MC_SCYLLA_PORT", "9042")))
    p.add_argument("--scylla-keyspace", default=env("MC_SCYLLA_KEYSPACE", ""))
    return p


def _settings(args: argparse.Namespace) -> None:
    quick = args.quick
    if args.duration is None:
        args.duration = 0.5 if quick else 5.0
    if args.warmup is None:
        args.warmup = 0.3 if quick else 2.0
    if args.rounds is None:
        args.rounds = 1 if quick else 3
    if args.conversations is None:
        args.conversations = 100 if quick else 1000
    kinds = [k.strip() for k in args.workloads.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ALL_WORKLOADS]
    if unknown:
        raise SystemExit(f"bench: unknown workload(s) {', '.join(unknown)}")
    args.kinds = [Kind(k) for k in kinds]
    positive = ("concurrency", "clients", "duration", "body_bytes", "conversations", "members")
    for name in (*positive, "hot_members", "page_size", "timeout", "rounds"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"bench: --{name.replace('_', '-')} must be positive")
    if args.requests < 0 or args.warmup < 0:
        raise SystemExit("bench: --requests and --warmup must not be negative")
    if args.clients > args.concurrency:
        raise SystemExit("bench: --clients must not exceed --concurrency")
    if not (0 <= args.dup_ratio <= 1 and 0 <= args.conflict_ratio <= 1):
        raise SystemExit("bench: ratios must be between 0 and 1")
    if args.target and args.backend == "all":
        raise SystemExit("bench: --target drives one server: name its --backend")


class Progress:
    """One status line on stderr: redrawn with \\r on a tty, else a line every 5 s."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._every = 0.25 if self._tty else 5.0
        self._label = ""
        self._duration = 0.0
        self._start = self._last = 0.0

    def begin(self, label: str, duration: float) -> None:
        self._label, self._duration = label, duration
        self._start = self._last = time.monotonic()

    def tick(self, calls: int) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            return
        self._last = now
        elapsed = now - self._start
        rate = calls / elapsed if elapsed > 0 else 0.0
        text = (
            f"{self._label}: {elapsed:5.1f}/{self._duration:.1f}s {calls:>9} calls {rate:>9.0f}/s"
        )
        if self._tty:
            self._stream.write("\r" + text.ljust(78))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def end(self) -> None:
        if self._tty:
            self._stream.write("\r" + " " * 78 + "\r")
            self._stream.flush()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class BackendBench:
    """Runs every phase against one target."""

    def __init__(
        self,
        args: argparse.Namespace,
        target: Target,
        pool: ClientPool,
        population: Population,
        progress: Progress,
    ) -> None:
        self.args = args
        self.target = target
        self.pool = pool
        self.population = population
        self.progress = progress
        self.report = BackendReport(target.backend, target.description)

    def _jobs(self, kind: Kind, duration: float) -> list[Job]:
        a = self.args
        max_calls = a.requests or MAX_CALLS
        start_at = time.time() + 0.2
        ratio = a.dup_ratio if kind is Kind.DUPMIX else a.conflict_ratio
        return [
            Job(
                kind=kind,
                target=self.target.address,
                population=self.population,
                streams=streams,
                max_calls=calls,
                start_at=start_at,
                duration_s=duration,
                timeout_s=a.timeout,
                body_bytes=a.body_bytes,
                ratio=ratio,
                page_size=a.page_size,
                seed=a.seed,
            )
            for streams, calls in zip(
                _split(a.concurrency, a.clients), _split(max_calls, a.clients), strict=True
            )
        ]

    async def grpc_phase(self, kind: Kind, duration: float, label: str) -> Round:
        self.progress.begin(f"[{self.target.backend}] {label}", duration)
        before = await self.target.requests()
        limit = duration + self.args.timeout + 60
        try:
            result = await self.pool.run(self._jobs(kind, duration), self.progress.tick, limit)
        finally:
            self.progress.end()
        return Round(result, _delta(before, await self.target.requests()))

    async def floor_phase(self, op: Callable[[], Awaitable[None]], label: str) -> Round:
        a = self.args
        self.progress.begin(f"[{self.target.backend}] {label}", a.duration)
        before = await self.target.requests()
        try:
            result = await run_ops(
                op, a.concurrency, a.duration, a.requests or MAX_CALLS, self.progress.tick
            )
        finally:
            self.progress.end()
        return Round(result, _delta(before, await self.target.requests()))

    async def run(self) -> BackendReport:
        a = self.args
        await create_population(self.target.address, self.population)
        if a.warmup > 0:
            warm = await self.grpc_phase(Kind.FRESH, a.warmup, "warm-up")
            if not warm.result.ok:
                raise BenchError(f"warm-up: no commit succeeded ({dict(warm.result.errors)})")
        floors: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        backend = self.target.floor_backend
        if a.no_floors:
            self.report.notes.append("in-process floors skipped (--no-floors)")
        elif backend is None:
            self.report.notes.append("storage floor skipped: no backend address given")
        else:
            driver = StorageDriver(backend, self.population, a.body_bytes, a.seed)
            committer = driver.committer_op(CommitLimits(sender_rate_per_s=0))
            floors = [
                ("storage-floor", driver.fresh),
                ("storage-replay", driver.replay),
                ("committer-floor", committer),
            ]
        rounds: dict[str, list[Round]] = {}
        for number in range(1, a.rounds + 1):
            suffix = f" (round {number}/{a.rounds})" if a.rounds > 1 else ""
            for kind in (Kind.GRPC_FLOOR, *a.kinds):
                got = await self.grpc_phase(kind, a.duration, kind.value + suffix)
                rounds.setdefault(kind.value, []).append(got)
            for name, op in floors:
                rounds.setdefault(name, []).append(await self.floor_phase(op, name + suffix))
        for name, measured in rounds.items():
            if name in FLOOR_DESCRIPTIONS:
                kind_name, text = "floor", FLOOR_DESCRIPTIONS[name]
            else:
                kind = Kind(name)
                kind_name = "floor" if kind is Kind.GRPC_FLOOR else "workload"
                text = DESCRIPTIONS[kind]
            self.report.phases[name] = Phase.build(name, kind_name, text, measured)
        if self.target.server is None and not self.target.metrics_url:
            self.report.notes.append("cost per op unavailable: pass --metrics-url")
        if self.target.backend == "redis" and self.target.redis_url:
            from backends.redis.sizing import measure_committed_record

            self.report.redis_record = await measure_committed_record(
                self.target.redis_url, a.body_bytes
            )
        return self.report


def _delta(before: Counter[str] | None, after: Counter[str] | None) -> Counter[str] | None:
    if before is None or after is None:
        return None
    return Counter({k: max(0, after[k] - before[k]) for k in set(before) | set(after)})


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
    )
    try:
        bench = BackendBench(args, target, pool, population, Progress())
        report = await bench.run()
    finally:
        try:
            await pool.reset()  # close the channels before the server goes
        finally:
            await target.close()
        env.close()  # free the CPU a throwaway redis or Cassandra would take from the next
    report.notes.append(f"{args.concurrency} streams from {args.clients} client processes")
    return report


async def _run(args: argparse.Namespace, backends: list[str]) -> dict[str, BackendReport]:
    tag = run_tag()
    given = BackendAddress(
        redis_url=args.redis_url,
        scylla_contact_points=tuple(p for p in args.scylla_contact_points.split(",") if p),
        scylla_port=args.scylla_port,
        scylla_keyspace=args.scylla_keyspace,
    )
    env = Environment(given, tag)
    pool = ClientPool(args.clients)
    reports: dict[str, BackendReport] = {}
    try:
        for name in backends:
            reports[name] = await _bench_backend(name, args, env, pool, tag)
            print("\n".join(backend_text(reports[name])), flush=True)
            print(flush=True)
    finally:
        pool.close()
        env.close()
    return reports


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
        "warmup_s": args.warmup,
        "body_bytes": args.body_bytes,
        "conversations": args.conversations,
        "members": args.members,
        "hot_members": args.hot_members,
        "dup_ratio": args.dup_ratio,
        "conflict_ratio": args.conflict_ratio,
        "page_size": args.page_size,
        "workloads": [k.value for k in args.kinds],
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
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    settings = _json_settings(args, argv, backends)
    info = machine()
    try:
        reports = asyncio.run(_run(args, backends))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    checks = check_targets(reports)
    print("\n".join(targets_text(checks)))
    document = to_json(settings, reports, checks, info)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
    print(f"results written to {args.json}")
    failed = any(c.passed is False for c in checks)
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
