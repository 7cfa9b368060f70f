"""``message-committer delivery-soak``: delivery under failovers, kills and skewed clocks.

    message-committer delivery-soak --backend {redis,scylla} [--duration 600] [--seed K]

Starts the storage (redis: master + replica + 3 Sentinels, every serve and relay with
MC_REDIS_WAIT_REPLICAS=1; scylla: the 3-node Cassandra cluster, RF 3), three ``serve``
replicas and two ``relay`` processes (scylla: each under ``faketime`` with its own
clock offset, inside the backend's skew guard, so outbox positions land late relative
to each other), small and big conversations (``--fanout-threshold``), senders that
commit through the replicas and retry the same key until definite, and one reader per
user syncing its lanes. Every ``--fault-interval`` seconds the next fault of the
backend's rotation fires (redis: a Sentinel failover, a SIGKILL of the master, relay
and serve kills; scylla: a node kill and restart, relay and serve kills); each must be
seen to take effect. Then the faults stop, the unknown sends are tried again, the
relays drain (bounded), every lane is read again from the start of its epoch and the
checker (``ledger.py``) runs. Prints a progress line a minute, then the figures; the
last line is ``violations: N``. Exit 1 when N > 0, a fault did not take effect, or
fewer than ``--min-acks`` commits were ACKed; 2 when the run could not start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from service.api.errors import ConversationExists
from toolkit.soak.ledger import Findings, Ledger, Observations, check, from_saved
from toolkit.soak.load import Clients, Reader, Senders, final_readers, reader_loop, readers
from toolkit.soak.procs import Proc, ProcError, faketime_prefix
from toolkit.soak.storage import Storage

ROTATION = {
    "redis": ["sentinel-failover", "kill-relay", "kill-serve", "kill-master", "kill-relay",
              "kill-serve"],
    "scylla": ["kill-node", "kill-relay", "kill-serve", "kill-relay", "kill-serve",
               "kill-relay"],
}  # fmt: skip
SERVE_CLOCKS = ("+1.5s", "-1.5s", "+0s")
RELAY_CLOCKS = ("+1s", "-1s")
"""Real offsets under faketime (scylla): within the 3 s skew guard of the CQL clock."""
SERVE_FLAGS = ["--recovery-interval", "2s", "--recovery-grace", "5s", "--sender-rate-per-s",
               "0", "--readiness-interval", "500ms"]  # fmt: skip
CREATE_TRIES = 30
FINAL_TRIES = 30
START_TRIES = 5
START_PAUSE_S = 5.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="message-committer delivery-soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--backend", choices=["redis", "scylla"], required=True)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load and faults")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--fault-interval", type=float, default=20.0, help="seconds between faults")
    p.add_argument("--faults", default="", help="comma-separated kinds of the rotation to keep")
    p.add_argument("--relays", type=int, default=2, choices=[1, 2])
    p.add_argument("--senders", type=int, default=6)
    p.add_argument("--users", type=int, default=12)
    p.add_argument("--small", type=int, default=6, help="conversations of 2-5 members")
    p.add_argument("--big", type=int, default=2, help="conversations above the threshold")
    p.add_argument("--fanout-threshold", type=int, default=5)
    p.add_argument("--drain-timeout", type=float, default=300.0)
    p.add_argument("--min-acks", type=int, default=None, help="default: one per 3 s of load")
    p.add_argument("--progress-interval", type=float, default=60.0)
    p.add_argument("--keep-dir", type=Path, default=None, help="keep logs and history.json here")
    p.add_argument(
        "--recheck",
        type=Path,
        default=None,
        metavar="HISTORY_JSON",
        help="only check a history.json a run saved, and print the findings",
    )
    return p


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.storage = Storage(args.backend, work)
        self.serves: list[Proc] = []
        self.relays: list[Proc] = []
        self.ledger = Ledger()
        self.observations = Observations()
        self.fired: Counter[str] = Counter()
        self.observed: Counter[str] = Counter()
        self.failed: list[str] = []
        self.tenant = f"soak-{uuid.uuid4().hex[:8]}"
        self.began = time.monotonic()

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.began:6.0f}s] {text}", flush=True)

    async def start(self) -> None:
        a = self.args
        scylla = a.backend == "scylla"
        serve_clocks = [faketime_prefix(c) for c in SERVE_CLOCKS] if scylla else [[]] * 3
        relay_clocks = [faketime_prefix(c) for c in RELAY_CLOCKS] if scylla else [[]] * 2
        relay_clocks = relay_clocks[: a.relays]
        await self.storage.start()
        self.log(f"storage {a.backend} up")
        env = {**self.storage.serve_env(), "MC_FANOUT_THRESHOLD": str(a.fanout_threshold),
               "MC_MAILBOX_MAX_ENTRIES": "1000000"}  # fmt: skip
        args = self.storage.serve_args()
        for i, clock in enumerate(serve_clocks):
            self.serves.append(Proc(f"serve{i}", "serve", [*args, *SERVE_FLAGS], env,
                                    self.work, clock))  # fmt: skip
        for i, clock in enumerate(relay_clocks):
            relay_env = {**env, "MC_LOG_LEVEL": "INFO"}
            self.relays.append(Proc(f"relay{i}", "relay", args, relay_env, self.work, clock))
        for proc in [*self.serves, *self.relays]:
            await asyncio.to_thread(proc.start)
        clocks = ", ".join(f"{p.name} {' '.join(p.prefix[1:]) or 'real clock'}"
                           for p in [*self.serves, *self.relays])  # fmt: skip
        self.log(f"3 serve + {len(self.relays)} relay processes ready ({clocks})")

    async def create_conversations(self, clients: Clients) -> None:
        a = self.args
        users = [f"u{i:02d}" for i in range(a.users)]
        plan = [(f"small{i}", self.rng.randint(2, min(5, a.fanout_threshold)))
                for i in range(a.small)]  # fmt: skip
        plan += [(f"big{i}", self.rng.randint(a.fanout_threshold + 1, max(a.fanout_threshold + 1,
                                               a.users))) for i in range(a.big)]  # fmt: skip
        for name, size in plan:
            members = frozenset(self.rng.sample(users, min(size, len(users))))
            for attempt in range(CREATE_TRIES):
                try:
                    await clients.pick(attempt).create_conversation(
                        self.tenant, name, sorted(members)
                    )
                    break
                except ConversationExists:
                    break
                except Exception:
                    await asyncio.sleep(1.0)
            else:
                raise ProcError(f"conversation {name} could not be created")
            self.ledger.add_conversation(name, members, a.fanout_threshold)

    async def fault(self, kind: str) -> None:
        self.fired[kind] += 1
        try:
            if kind in ("kill-relay", "kill-serve"):
                procs = self.relays if kind == "kill-relay" else self.serves
                proc = procs[self.fired[kind] % len(procs)]
                what = await asyncio.to_thread(_kill_and_restart, proc)
            else:
                what = await self.storage.fire(kind)
        except Exception as exc:  # not seen to take effect, or not healed: the run fails
            self.failed.append(f"{kind}: {type(exc).__name__}: {str(exc)[:300]}")
            self.log(f"fault {kind} did NOT take effect: {exc}")
            return
        self.observed[kind] += 1
        self.log(f"fault {kind}: {what}")

    async def faults(self, stop: asyncio.Event) -> None:
        rotation = self.rotation()
        n = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.args.fault_interval)
                return
            await self.fault(rotation[n % len(rotation)])
            n += 1

    async def progress(self, senders: Senders, readers_: list[Reader]) -> None:
        while True:
            await asyncio.sleep(self.args.progress_interval)
            c = senders.counts
            self.log(
                f"acks {c['acks']}, unknown {len(self.ledger.unknown)}, retries {c['retries']},"
                f" entries read {self.observations.entries}, faults {sum(self.observed.values())}"
                f" (failovers {self.failovers()}), rebuilds {sum(r.rebuilds for r in readers_)},"
                f" reused seqs {len(self.observations.reused)}"
            )

    def rotation(self) -> list[str]:
        wanted = {k for k in self.args.faults.split(",") if k}
        return [k for k in ROTATION[self.args.backend] if not wanted or k in wanted]

    def failovers(self) -> int:
        return self.observed["sentinel-failover"] + self.observed["kill-master"]

    async def run(self) -> int:
        await self.start()
        clients = Clients(self.tenant, [p.target for p in self.serves])
        clients.open()
        try:
            return await self._load(clients)
        finally:
            await clients.close()

    async def _load(self, clients: Clients) -> int:
        a = self.args
        await self.create_conversations(clients)
        big = sum(c.own_lane for c in self.ledger.conversations.values())
        self.log(f"{len(self.ledger.conversations)} conversations ({big} over the threshold)")
        senders = Senders(clients, self.ledger, self.rng)
        the_readers = readers(self.ledger, clients, self.observations)
        stop_load, stop_read, stop_faults = asyncio.Event(), asyncio.Event(), asyncio.Event()
        sending = [asyncio.create_task(senders.run(i, stop_load)) for i in range(a.senders)]
        reading = [asyncio.create_task(reader_loop(r, i, stop_read, 0.5))
                   for i, r in enumerate(the_readers)]  # fmt: skip
        faulting = asyncio.create_task(self.faults(stop_faults))
        progress = asyncio.create_task(self.progress(senders, the_readers))
        await asyncio.sleep(a.duration)
        stop_faults.set()
        await faulting
        for proc in [*self.serves, *self.relays]:
            await asyncio.to_thread(supervise, proc)  # every process up
        stop_load.set()
        await asyncio.gather(*sending)
        self.log(f"load stopped; {len(self.ledger.unknown)} unknown outcomes, trying them again")
        resolved = await senders.resolve()
        drained = await self._drain()
        stop_read.set()
        await asyncio.gather(*reading)
        progress.cancel()
        final = final_readers(self.ledger, clients, self.observations)
        for i, reader in enumerate(final):
            for attempt in range(FINAL_TRIES):  # to the end of each lane, whichever replica
                if await reader.read_all(i + attempt):
                    break
                await asyncio.sleep(1.0)
            else:
                self.failed.append(f"final read: {reader.user} {reader.lanes} did not complete")
        return self._report(senders, [*the_readers, *final], resolved, drained, clients)

    async def _drain(self) -> float:
        began = time.monotonic()
        while time.monotonic() - began < self.args.drain_timeout:
            if not check(self.ledger, self.observations).missing:
                break
            await asyncio.sleep(2.0)
        took = time.monotonic() - began
        self.log(f"drained in {took:.0f}s")
        return took

    def _report(self, senders: Senders, all_readers: list[Reader], resolved: int,
                drained: float, clients: Clients) -> int:  # fmt: skip
        a = self.args
        found = check(self.ledger, self.observations)
        c = senders.counts
        epochs = self.observations.epochs()
        new_epochs = sum(len([e for e in es if e > 1]) for es in epochs.values())
        min_acks = a.min_acks if a.min_acks is not None else int(a.duration / 3)
        kinds = sorted(set(self.fired) | set(self.rotation()))
        fired = ", ".join(f"{k} {self.observed[k]}/{self.fired[k]}" for k in kinds)
        errors = ", ".join(f"{k} x{n}" for k, n in sorted(clients.errors.items())) or "none"
        wall = time.monotonic() - self.began
        print(f"backend: {a.backend}, duration {a.duration:.0f}s, wall {wall:.0f}s")
        print(
            f"commits ACKed: {len(self.ledger.acked)} (after the load: {resolved} of the unknown)"
        )
        print(f"unknown outcomes: {len(self.ledger.unknown)}; retries {c['retries']}; refused "
              f"{sum(n for k, n in c.items() if k.startswith('refused'))}")  # fmt: skip
        print(f"client errors: {errors}")
        print(f"faults observed/fired: {fired}; failovers {self.failovers()}")
        print(
            f"mailboxes {len(epochs)}; entries read {self.observations.entries};"
            f" drain {drained:.0f}s"
        )
        print(
            f"rebuilds (CURSOR_EXPIRED) {sum(r.rebuilds for r in all_readers)}; "
            f"epochs started {new_epochs}"
        )
        print(_findings_text(found))
        if a.keep_dir is not None:
            self._save(a.keep_dir / "history.json")
        for line in found.violations[:30]:
            print(f"  {line}")
        for line in self.failed:
            print(f"  not done: {line}")
        if len(self.ledger.acked) < min_acks:
            print(f"  too few ACKs: {len(self.ledger.acked)} < {min_acks}")
        print(f"violations: {len(found.violations)}", flush=True)
        bad = found.violations or self.failed or len(self.ledger.acked) < min_acks
        return 1 if bad else 0

    def _save(self, path: Path) -> None:
        """The ledger and every observation, to check again or to dig into."""
        at = self.ledger.acked_at.get
        saved = {
            "conversations": {n: sorted(c.members) for n, c in self.ledger.conversations.items()},
            "acked": [[*k, v, at(k)] for k, v in sorted(self.ledger.acked.items())],
            "first_seen": [[m, e, at] for (m, e), at in self.observations.first_seen.items()],
            "unknown": sorted(self.ledger.unknown),
            "slots": [[m, e, s, *v.key, v.message_id]
                      for (m, e, s), v in sorted(self.observations.slots.items())],
            "reused": self.observations.reused,
        }  # fmt: skip
        path.write_text(json.dumps(saved))

    def close(self) -> None:
        for proc in [*self.relays, *self.serves]:
            with contextlib.suppress(Exception):
                proc.kill()
        with contextlib.suppress(Exception):
            self.storage.close()


def _findings_text(found: Findings) -> str:
    return (
        f"(message, mailbox) pairs checked {found.checked}; duplicates {len(found.duplicates)},"
        f" missing {len(found.missing)}, stray {len(found.stray)}, reused seqs"
        f" {len(found.reused)}; lost commits seen only in epochs the lane left (healed by"
        f" the rebuild) {len(found.healed)}"
    )


def supervise(proc: Proc) -> int:
    """Start ``proc`` if it is not running, as a supervisor would: a start that fails
    (a backend that does not answer in time while a node restarts) is tried again.
    How many starts failed; ProcError after ``START_TRIES``."""
    for failed in range(START_TRIES):
        try:
            proc.start()
            return failed
        except ProcError as exc:
            last = exc
            time.sleep(START_PAUSE_S)
    raise last


def _kill_and_restart(proc: Proc) -> str:
    restarts = supervise(proc)  # one that died on its own is started again first
    proc.kill()
    time.sleep(1.0)
    restarts += supervise(proc)
    again = f" ({restarts} failed start(s) tried again)" if restarts else ""
    return f"{proc.name} killed and restarted{again}"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.duration <= 0 or args.fault_interval <= 0 or args.senders < 1 or args.users < 2:
        print("delivery-soak: --duration, --fault-interval > 0; --senders >= 1; --users >= 2",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.fanout_threshold < 2 or (args.users <= args.fanout_threshold and args.big > 0):
        print("delivery-soak: --users must exceed --fanout-threshold (>= 2) for big conversations",
              file=sys.stderr)  # fmt: skip
        return 2
    unknown = {k for k in args.faults.split(",") if k} - set(ROTATION[args.backend])
    if unknown:
        print(f"delivery-soak: --faults of {args.backend}: {', '.join(ROTATION[args.backend])}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.recheck is not None:
        saved = json.loads(args.recheck.read_text())
        found = check(*from_saved(saved, args.fanout_threshold))
        print(_findings_text(found))
        for line in found.violations:
            print(f"  {line}")
        print(f"violations: {len(found.violations)}")
        return 1 if found.violations else 0
    if args.keep_dir is not None:
        args.keep_dir.mkdir(parents=True, exist_ok=True)
        return _main(args, args.keep_dir)
    with tempfile.TemporaryDirectory(prefix="mc-soak-") as work:
        return _main(args, Path(work))


def _main(args: argparse.Namespace, work: Path) -> int:
    soak: Soak | None = None
    try:
        soak = Soak(args, work)
        return asyncio.run(soak.run())
    except ProcError as exc:
        print(f"delivery-soak: {exc}", file=sys.stderr)
        return 2
    finally:
        if soak is not None:
            soak.close()


if __name__ == "__main__":
    sys.exit(main())
