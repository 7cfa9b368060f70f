"""``message-committer nemesis``: replicas over a clustered backend, faults, two checkers.

    message-committer nemesis --backend {redis,redis-cluster,scylla} --schedules N --duration S
                              [--seed K]

Starts the storage (scylla: a three-node Cassandra cluster, RF 3, QUORUM / SERIAL;
redis: a standalone redis-server, or ``--redis-topology sentinel``; redis-cluster (the
same as ``--backend redis --redis-topology cluster``): a Redis Cluster of 3 masters + 3
replicas announcing their proxies' addresses, its faults aimed at the master of a shard,
``toolkit/nemesis/redis_cluster.py``), a Toxiproxy proxy in front of each storage node,
``--replicas`` ``serve`` processes reaching storage through the proxies, and
``--clients`` concurrent gRPC clients recording every call in a JSONL history
(``toolkit/nemesis/history.py``). Schedule i runs the faults of seed K+i
(``toolkit/nemesis/schedule.py``; replay one with ``--seed K+i --schedules 1``), then
heals everything, recovers, reads every conversation's whole history and runs both
checkers: the project's own (``checker.py``) and porcupine (``linearizability.py``).
Prints per schedule what fired and what was found; the last line is ``anomalies: N
(checker), M (porcupine)``; exits 1 when N + M > 0, and also when a scheduled fault
never began (the load outlasts --duration while faults remain, up to an overrun) or
could not start, when a fault's effect was not observed (``proof.py``: ``FAILED: faults
without effect``), when a schedule's ACKs fall under ``--min-acks``, when a schedule
with kills or pauses saw no unknown outcome, or when the conversations could not be
created.

``--sabotage MODE`` runs the replicas from a copy of this checkout broken in one way
(``sabotage.py``; the service itself has no such switch), one mode per rule of the
checkers, to show that they catch a broken build. Modes:
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from service.api.errors import ConversationExists
from service.client import NO_RETRY, CommitClient
from service.config import parse_duration
from service.domain.errors import CommitError
from toolkit.nemesis import checker, expiry, linearizability
from toolkit.nemesis.history import HistoryWriter, fault_counts, load_file
from toolkit.nemesis.outcomes import UNKNOWN_OUTCOME
from toolkit.nemesis.proof import (
    Proof,
    ScheduleFigures,
    default_min_acks,
    overrun_s,
    quorum_lost_seconds,
    verdict,
)
from toolkit.nemesis.redis_cluster import RedisClusterTopology
from toolkit.nemesis.replica_faults import KINDS as REPLICA_KINDS
from toolkit.nemesis.replica_faults import ReplicaFaults, clock_offset
from toolkit.nemesis.replicas import REPO, Replica, supports
from toolkit.nemesis.sabotage import MODES, SabotageError, broken_build, describe
from toolkit.nemesis.schedule import MIN_FAULT_S, Fault, FaultKind, make_schedule
from toolkit.nemesis.topology import RedisTopology, ScyllaTopology, Topology
from toolkit.nemesis.toxiproxy import ToxiproxyError, ToxiproxyServer
from toolkit.nemesis.workload import SENDERS, Workload

STOP_GRACE_S = 25.0
FAULT_END_TIMEOUT_S = 400.0
MIN_OVERRUN_S = 60.0
SERVICE_RESTARTS = ("kill-replica", "clock-offset", "kill-relay", "clock-relay")
"""Fault kinds whose end starts a serve or relay process again (it opens the storage)."""
NODE_OUTAGES = frozenset({"kill-node", "pause-node", "partition-node"})
"""The load goes on at least this long past --duration while scheduled faults remain."""
CREATE_TRIES = 20
"""How long the fault running at the end may take to end (a node restart on a busy box)."""
READY_TIMEOUT_S = 90.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="message-committer nemesis",
                                description=f"{__doc__}{describe()}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--backend", choices=["redis", "redis-cluster", "scylla"], required=True)
    p.add_argument(
        "--system",
        choices=["commits", "e2e"],
        default="commits",
        help="e2e: also two relays and --users users with two device processes each, and"
        " the delivery and lane checks; fault kinds kill-relay, kill-device, new-epoch too"
        " (toolkit/nemesis/e2e/)",
    )
    p.add_argument("--users", type=int, default=3, help="--system e2e: users (two devices each)")
    p.add_argument("--schedules", type=int, default=1)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of faults per schedule")
    p.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    p.add_argument("--max-fault-seconds", type=float, default=8.0, help="longest fault")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument(
        "--redis-topology",
        choices=["standalone", "sentinel", "cluster"],
        default=None,
        help="--backend redis: standalone (the default), sentinel or cluster (what"
        " --backend redis-cluster means)",
    )
    p.add_argument(
        "--redis-wait-replicas",
        type=int,
        default=None,
        help="replicas an ACK waits for (MC_REDIS_WAIT_REPLICAS of every serve); default: theirs",
    )
    p.add_argument("--faults", default="", help="comma-separated fault kinds (default: all)")
    p.add_argument(
        "--min-acks",
        type=int,
        default=None,
        help="a schedule with fewer ACKs fails the run (default: one per second of"
        " --duration, at least 10)",
    )
    p.add_argument(
        "--idempotency-window",
        default=None,
        help="MC_IDEMPOTENCY_WINDOW of every serve, e.g. 30s, so that keys expire during"
        " the run (history retention stays the default 30 d: messages stay readable); the"
        " checkers take a key used again after its window as another key (expiry.py)",
    )
    p.add_argument(
        "--sabotage",
        choices=sorted(MODES),
        default=None,
        help="run the replicas from a deliberately broken copy (sabotage.py); the run must"
        " report anomalies",
    )
    p.add_argument("--keep-dir", type=Path, default=None, help="keep histories and logs here")
    return p


class Nemesis:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.toxiproxy = ToxiproxyServer(log_dir=work)
        self.topology: Topology | None = None
        self.replicas: list[Replica] = []
        self.fired: dict[str, int] = {}
        self.events: Counter[str] = Counter()
        """Backend events the replicas reported over the schedules run."""
        self.unsupported: list[str] = []
        self.skipped = 0
        self.failed: dict[str, int] = {}
        self.proven: Counter[str] = Counter()
        self.unproven: Counter[str] = Counter()
        self.failures: list[str] = []
        """The FAILED lines of every schedule (``proof.verdict``)."""
        self.replica_faults: ReplicaFaults | None = None
        self.seed = 0
        self.outages: list[tuple[int, float, float]] = []
        """(node, down from, answering again) of this schedule's storage kills and pauses."""

    async def start(self) -> None:
        toxi = self.toxiproxy.start()
        a = self.args
        if a.backend == "scylla":
            self.topology = ScyllaTopology(self.work, toxi)
        elif a.redis_topology == "cluster":
            self.topology = RedisClusterTopology(self.work, toxi)
        else:
            self.topology = RedisTopology(self.work, toxi, a.redis_topology)
        began = time.monotonic()
        await self.topology.start()
        print(f"storage: {a.backend} up in {time.monotonic() - began:.1f}s", flush=True)
        common = ["--recovery-interval", "2s", "--recovery-grace", "5s", "--sender-rate-per-s",
                  "0", "--readiness-interval", "500ms"]  # fmt: skip
        env = self.topology.serve_env()
        root = broken_build(REPO, self.work, a.sabotage) if a.sabotage else None
        if a.redis_wait_replicas is not None:
            env["MC_REDIS_WAIT_REPLICAS"] = str(a.redis_wait_replicas)
        if a.idempotency_window:
            env["MC_IDEMPOTENCY_WINDOW"] = a.idempotency_window  # retention stays 30 d
        for i in range(a.replicas):
            replica = Replica(i, [*self.topology.serve_args(), *common], env, self.work, root)
            self.replicas.append(replica)
            await asyncio.to_thread(replica.start)
        self.replica_faults = ReplicaFaults(
            self.replicas, a.backend, storage_restart_s=self.topology.restart_s
        )

    def kinds(self) -> list[FaultKind]:
        assert self.topology is not None
        assert self.replica_faults is not None
        n = len(self.replicas)
        kinds = [*self.topology.fault_kinds()]
        kinds += [FaultKind(k, n, domain="replica") for k in REPLICA_KINDS if k != "clock-offset"]
        if self.replica_faults.library is not None:
            kinds.append(FaultKind("clock-offset", n, domain="replica"))
        else:
            note = "clock-offset: faketime (libfaketime) is not installed"
            if note not in self.unsupported:
                self.unsupported.append(note)
        wanted = {k for k in self.args.faults.split(",") if k}
        return [k for k in kinds if not wanted or k.name in wanted]

    async def apply(self, fault: Fault, history: HistoryWriter) -> None:
        """Begin ``fault`` on each target, observe its effect while it runs, end it,
        and observe a kill's restart; every proof goes into the history."""
        began: list[int] = []
        for t in fault.targets:
            history.fault(fault.kind, str(t), "start")
            try:
                await self._begin(fault, t)
                began.append(t)
            except Exception as exc:
                print(f"  fault {fault.kind}[{t}] failed to start: {type(exc).__name__}: {exc}")
                history.fault(fault.kind, str(t), "failed")
        if len(began) == len(fault.targets):
            self.fired[fault.kind] = self.fired.get(fault.kind, 0) + 1
        else:  # a fault that did not begin proves nothing: the run fails
            self.failed[fault.kind] = self.failed.get(fault.kind, 0) + 1
        down_from = time.monotonic()
        proofs = [self._prove(fault.kind, t, history, "begin") for t in began]
        seen = await asyncio.gather(asyncio.sleep(fault.for_s), *proofs)
        for t in fault.targets:
            try:
                await self._end(fault.kind, t)
            except Exception as exc:
                print(f"  fault {fault.kind}[{t}] failed to end: {type(exc).__name__}: {exc}")
            history.fault(fault.kind, str(t), "end")
        ends = [await self._prove(fault.kind, t, history, "end") for t in began]
        if fault.kind in NODE_OUTAGES:  # down until its restart answered its probe
            self.outages += [(t, down_from, time.monotonic()) for t in began]
        if not began:
            return
        if all(seen[1:]) and all(ends):
            self.proven[fault.kind] += 1
        else:
            self.unproven[fault.kind] += 1

    async def _prove(self, kind: str, target: int, history: HistoryWriter, when: str) -> bool:
        """Observe ``kind`` on ``target`` (at its beginning or after its end); record it."""
        assert self.topology is not None
        found: Proof | None
        try:
            if kind in REPLICA_KINDS:
                rf = self.replica_faults
                assert rf is not None
                found = await (rf.prove_end(kind, target) if when == "end"
                               else asyncio.to_thread(rf.prove_begin, kind, target))  # fmt: skip
            else:
                prove = self.topology.prove_end if when == "end" else self.topology.prove_begin
                found = await asyncio.to_thread(prove, kind, target)
        except Exception as exc:
            found = Proof(False, f"could not observe: {type(exc).__name__}")
        if found is None:
            return True
        history.fault(kind, str(target), "proven" if found.ok else "no-effect", found.evidence)
        if not found.ok:
            print(f"  fault {kind}[{target}] without effect ({when}): {found.evidence}")
        return found.ok

    async def _begin(self, fault: Fault, target: int) -> None:
        assert self.topology is not None
        if fault.kind in REPLICA_KINDS:
            assert self.replica_faults is not None  # off the loop: a kill reads the metrics first
            offset = clock_offset(self.seed, fault.at_s, target)
            await asyncio.to_thread(self.replica_faults.begin, fault.kind, target, offset)
        else:
            await self.topology.begin(fault.kind, target)

    async def _end(self, kind: str, target: int) -> None:
        assert self.topology is not None
        if kind in REPLICA_KINDS:
            assert self.replica_faults is not None
            await asyncio.to_thread(self.replica_faults.end, kind, target)
        else:
            await self.topology.end(kind, target)

    async def heal(self) -> None:
        assert self.topology is not None
        await self.topology.heal()
        for replica in self.replicas:
            replica.resume()
            if replica.extra_env:
                await asyncio.to_thread(replica.restart, {})
            await asyncio.to_thread(replica.start)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for replica in self.replicas:
            async with CommitClient.connect(replica.target, retry=NO_RETRY) as client:
                while time.monotonic() < deadline:
                    with contextlib.suppress(Exception):
                        if await client.health() == "SERVING":
                            break
                    await asyncio.sleep(0.5)

    async def create_conversations(
        self, tenant: str, history: HistoryWriter | None = None
    ) -> list[str]:
        """Create the run's conversations (members: ``SENDERS``), each recorded in
        ``history`` so the checkers know who may send."""
        names = [f"conv{i}" for i in range(self.args.conversations)]
        async with CommitClient.connect(self.replicas[0].target, retry=NO_RETRY) as client:
            for name in names:
                for _ in range(CREATE_TRIES):
                    try:
                        await client.create_conversation(tenant, name, SENDERS)
                        break
                    except ConversationExists:  # a lost reply to an earlier attempt
                        break
                    except CommitError:
                        await asyncio.sleep(1.0)
                else:  # every commit would be refused: a run without load proves nothing
                    raise NemesisError(
                        f"conversation {name} could not be created in {CREATE_TRIES} tries"
                    )
                if history is not None:
                    history.create(tenant, name, SENDERS)
        return names

    async def schedule(self, seed: int) -> tuple[int, int]:
        a = self.args
        tenant = f"nemesis-{seed}-{uuid.uuid4().hex[:6]}"
        path = self.work / f"schedule-{seed}.jsonl"
        self.seed = seed
        fired_before, unproven_before = dict(self.fired), Counter(self.unproven)
        history = HistoryWriter(path)
        conversations = await self.create_conversations(tenant, history)
        faults = make_schedule(seed, self.kinds(), a.duration, a.max_fault_seconds)
        print(f"schedule seed {seed}: {len(faults)} faults", flush=True)
        for f in faults:
            print(f"  {f.describe()}")
        targets = [r.target for r in self.replicas]
        events_before = await asyncio.to_thread(self.backend_events)
        work = Workload(tenant, conversations, targets, history, random.Random(seed))
        work.open()
        stop = asyncio.Event()
        began = time.monotonic()
        clients = [asyncio.create_task(work.client(i + 1, stop)) for i in range(a.clients)]

        # One fault after another: a slow node restart delays the rest, and the load
        # goes on past --duration until the last one has ended, up to an overrun.
        restarts = sum(len(f.targets) for f in faults if f.kind == "kill-node")
        starts = sum(len(f.targets) for f in faults if f.kind in SERVICE_RESTARTS)
        assert self.topology is not None
        overrun = overrun_s(
            a.duration,
            restarts * self.topology.restart_s + starts * self.topology.service_start_s,
            MIN_OVERRUN_S,
        )
        hard_end = began + a.duration + overrun
        self.outages = []

        async def nemesis() -> None:
            running: list[asyncio.Task[None]] = []
            for fault in faults:
                if not fault.overlap and running:  # the one before has ended first
                    await asyncio.gather(*running)
                    running.clear()
                if time.monotonic() + MIN_FAULT_S > hard_end:
                    self.skipped += 1  # out of time even with the overrun: the run fails
                    continue
                await asyncio.sleep(max(0.0, began + fault.at_s - time.monotonic()))
                running.append(asyncio.create_task(self.apply(fault, history)))
            await asyncio.gather(*running)

        faulting = asyncio.create_task(nemesis())
        await asyncio.sleep(a.duration)
        await asyncio.wait({faulting}, timeout=max(0.0, hard_end - time.monotonic()))
        stop.set()
        load_end = time.monotonic()
        await asyncio.wait_for(faulting, FAULT_END_TIMEOUT_S)
        await asyncio.wait_for(asyncio.gather(*clients), STOP_GRACE_S)
        await self.heal()
        settled = await work.settle()
        await work.close()
        history.close()
        checked = path
        if a.idempotency_window:  # each use of a key after its window is another key
            window_ms = int(parse_duration(a.idempotency_window) * 1000)
            checked, reused = expiry.split_file(path, window_ms)
            print(f"  keys re-reserved after the {a.idempotency_window} window: {reused}")
        own = checker.check(load_file(checked))
        html = self.work / f"schedule-{seed}-porcupine.html" if a.keep_dir else None
        por = await asyncio.to_thread(linearizability.run, checked, html)
        counts = work.counts
        fired = ", ".join(f"{k} x{n}" for k, n in sorted(fault_counts(path).items())) or "none"
        print(
            f"  ops {sum(counts.get(k, 0) for k in ('acks', 'unknown')) + _errors(counts)}:"
            f" acks {counts.get('acks', 0)}, unknown {counts.get('unknown', 0)},"
            f" errors {_errors(counts)}, retries {counts.get('retries', 0)},"
            f" replays {counts.get('replays', 0)}, conflicts {counts.get('conflicts', 0)},"
            f" non-member sends {counts.get('non-member sends', 0)},"
            f" reads {counts.get('reads', 0)};"
            f" recovered {settled['recovered']}, probes {settled['probes']}",
            flush=True,
        )
        print(f"  fired: {fired}")
        events = await asyncio.to_thread(self.backend_events)
        events.subtract(events_before)
        self.events.update(events)
        print(f"  backend events: {_events_text(events)}")
        for anomaly in own[:20]:
            print(f"  checker: {anomaly}")
        for line in por.output.splitlines():
            if line.startswith(("conversation ", "visualisation")):
                print(f"  porcupine: {line}")
        fired_here = {k: n - fired_before.get(k, 0) for k, n in self.fired.items()}
        lost = quorum_lost_seconds(self.outages, self.topology.node_count, began, load_end)
        if lost:
            print(f"  storage without a majority of its nodes for {lost:.1f}s of the load")
        unproven_here = self.unproven - unproven_before
        unknown_answers = counts.get("unknown", 0) + counts.get("retries", 0)
        unknown_answers += sum(counts.get(f"error {c}", 0) for c in UNKNOWN_OUTCOME)
        figures = ScheduleFigures(
            acks=counts.get("acks", 0),
            unknown_answers=unknown_answers,
            min_acks=a.min_acks if a.min_acks is not None else default_min_acks(a.duration, lost),
            fired=fired_here,
            unproven=dict(unproven_here),
        )
        for line in verdict(figures):
            print(f"  {line}")
            self.failures.append(f"{line} (seed {seed})")
        print(f"  anomalies: {len(own)} (checker), {por.anomalies} (porcupine)", flush=True)
        return len(own), por.anomalies

    def backend_events(self) -> Counter[str]:
        """The replicas' backend events so far, every process of each (``Replica.events``)."""
        total: Counter[str] = Counter()
        for replica in self.replicas:
            total += replica.events()
        if self.topology is not None:
            total += self.topology.events()
        return total

    def close(self) -> None:
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.kill()
        if self.topology is not None:
            with contextlib.suppress(Exception):
                self.topology.close()
        self.toxiproxy.stop()


class NemesisError(RuntimeError):
    """The run could not do what it must to prove anything (no conversations, say)."""


def _events_text(events: Counter[str]) -> str:
    shown = sorted((k, n) for k, n in events.items() if n > 0)
    return ", ".join(f"{k} x{n}" for k, n in shown) or "none"


def _errors(counts: dict[str, int]) -> int:
    return sum(n for k, n in counts.items() if k.startswith("error "))


async def _run(args: argparse.Namespace, work: Path) -> tuple[int, int, int]:
    """Anomalies found by each checker, and the faults that were scheduled and not proven."""
    nemesis: Nemesis
    if args.system == "e2e":
        from toolkit.nemesis.e2e.run import E2ENemesis  # it extends Nemesis

        nemesis = E2ENemesis(args, work)
    else:
        nemesis = Nemesis(args, work)
    total_own = total_por = done = 0
    try:
        await nemesis.start()
        first = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
        for i in range(args.schedules):
            try:
                own, por = await nemesis.schedule(first + i)
            except Exception as exc:  # storage that would not heal: report, do not crash
                nemesis.failures.append(
                    f"FAILED: schedule seed {first + i} could not finish, the run stopped"
                    f" after {i} schedule(s): {type(exc).__name__}: {str(exc)[:300]}"
                )
                break
            total_own += own
            total_por += por
            done += 1
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(nemesis.fired.items())) or "none"
        print(f"faults fired over {done} schedule(s): {kinds}")
        proven = ", ".join(f"{k} x{n}" for k, n in sorted(nemesis.proven.items())) or "none"
        print(f"faults proven over {done} schedule(s): {proven}")
        print(f"backend events over {done} schedule(s): {_events_text(nemesis.events)}")
        for note in nemesis.unsupported:
            print(note)
        if nemesis.skipped:
            print(f"FAILED: faults not begun (out of time after slow restarts): {nemesis.skipped}")
        if nemesis.failed:
            failed = ", ".join(f"{k} x{n}" for k, n in sorted(nemesis.failed.items()))
            print(f"FAILED: faults that could not start: {failed}")
        for line in nemesis.failures:
            print(line)
    finally:
        nemesis.close()
    unproven = nemesis.skipped + sum(nemesis.failed.values()) + len(nemesis.failures)
    return total_own, total_por, unproven


def _backend(args: argparse.Namespace) -> str | None:
    """``--backend redis-cluster`` as ``--backend redis --redis-topology cluster``; an
    error text for a contradiction."""
    if args.backend == "redis-cluster":
        if args.redis_topology not in (None, "cluster"):
            return f"--backend redis-cluster contradicts --redis-topology {args.redis_topology}"
        args.backend, args.redis_topology = "redis", "cluster"
    elif args.backend == "scylla" and args.redis_topology is not None:
        return "--redis-topology is for --backend redis"
    args.redis_topology = args.redis_topology or "standalone"
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    wrong = _backend(args)
    if wrong is not None:
        print(f"nemesis: {wrong}", file=sys.stderr)
        return 2
    if args.redis_topology == "sentinel" and not supports("redis+sentinel", "backends/redis"):
        print("nemesis: --redis-topology sentinel needs a Redis backend that accepts"
              " redis+sentinel:// URLs; this build's does not", file=sys.stderr)  # fmt: skip
        return 2
    work = args.keep_dir or Path(tempfile.mkdtemp(prefix="mc-nemesis-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        own, por, unproven = asyncio.run(_run(args, work))
    except (ToxiproxyError, SabotageError, NemesisError) as exc:
        print(f"nemesis: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"histories and logs kept in {work}")
    print(f"anomalies: {own} (checker), {por} (porcupine)")
    return 1 if own + por + unproven else 0
