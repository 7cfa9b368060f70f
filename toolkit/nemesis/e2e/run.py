"""The e2e nemesis: the commit nemesis plus relays, devices, and the delivery checks.

``E2ENemesis`` extends ``cli.Nemesis`` (storage behind Toxiproxy, ``--replicas`` serve
processes, its faults and proofs, its gRPC clients with replays and conflicts, its
checker and porcupine for the commits) with two ``relay`` processes
(``soak.procs.Proc``) and a ``devices.Fleet``; it adds four fault kinds, each proven
like the others: ``kill-relay`` (SIGKILL of the relay's process group, gone before
it counts; restarted at the fault's end, proven by its ready line), ``clock-relay``
(the relay restarted under faketime, ``relay_clock.py``),
``kill-device`` (SIGKILL of a device process, up to two at once; restarted on its
file at the end) and ``new-epoch`` (an operator starts the next epoch of a random
user's inbox, ``epochs.py``; proven by the lane's epoch, which must have grown).
After the commit checks, the devices settle and ``delivery.check`` and
``lanes.check`` judge them; their anomalies add to the checker's count. The
recipients of each message are its members at the membership version its delivery
was frozen at, which ``frozen.FrozenVersions`` reads from the inboxes' entries
during the run and at the settle (the answers of the membership changes carry
theirs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from pathlib import Path

from service.domain.delivery import MailboxStore
from toolkit.client_campaign.device import TENANT
from toolkit.nemesis.cli import Nemesis
from toolkit.nemesis.e2e import delivery, frozen, lanes, relay_clock
from toolkit.nemesis.e2e.devices import STALL_S, Fleet
from toolkit.nemesis.e2e.epochs import LaneEpochs
from toolkit.nemesis.e2e.frozen import FrozenVersions
from toolkit.nemesis.history import HistoryWriter
from toolkit.nemesis.proof import Proof
from toolkit.nemesis.replica_faults import clock_offset
from toolkit.nemesis.schedule import Fault, FaultKind
from toolkit.soak.procs import Proc

RELAYS = 2
RELAY_ENV = {"MC_LOG_LEVEL": "INFO", "MC_RELAY_LEASE": "2s", "MC_RELAY_IDLE_WAIT": "50ms"}
SETTLE_S = 60.0
E2E_KINDS = ("kill-relay", "kill-device", "new-epoch", relay_clock.KIND)


class E2ENemesis(Nemesis):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        work = work.resolve()  # a sabotaged run changes directory (start)
        super().__init__(args, work)
        self.relays: list[Proc] = []
        self.fleet: Fleet | None = None
        self.epochs: LaneEpochs | None = None
        self.root = work / f"broken-build-{args.sabotage}" if args.sabotage else None
        self.relay_clock: relay_clock.RelayClock | None = None

    async def start(self) -> None:
        await super().start()
        assert self.topology is not None
        env = {**self.topology.serve_env(), **RELAY_ENV}
        self.epochs = LaneEpochs(self.topology.serve_args(), self.topology.serve_env(), TENANT)
        if self.root is not None:  # the broken copy ahead of the checkout, for devices too:
            env["PYTHONPATH"] = str(self.root)  # the forkserver of the devices starts
            os.chdir(self.root)  # in this directory, first on its path
        for i in range(RELAYS):
            relay = Proc(f"relay{i}", "relay", self.topology.serve_args(), env, self.work,
                         cwd=self.root)  # fmt: skip
            self.relays.append(relay)
            await asyncio.to_thread(relay.start)
        assert self.replica_faults is not None
        self.relay_clock = relay_clock.RelayClock(
            self.relays, self.args.backend, self.replica_faults.start_retry_s
        )
        print(f"e2e: {len(self.replicas)} serve + {RELAYS} relay processes ready", flush=True)

    def kinds(self) -> list[FaultKind]:
        kinds = super().kinds()
        ours = [FaultKind("kill-relay", RELAYS, domain="relay")]
        if self.relay_clock is not None and self.relay_clock.library is not None:
            ours.append(FaultKind(relay_clock.KIND, RELAYS, domain="relay"))
        if self.fleet is not None:
            ours.append(FaultKind("kill-device", len(self.fleet.devices), 2, domain="device"))
            # it writes to the storage: never while a storage fault keeps it from it
            ours.append(FaultKind("new-epoch", len(self.fleet.users), domain="storage"))
        wanted = {k for k in self.args.faults.split(",") if k}
        return kinds + [k for k in ours if not wanted or k.name in wanted]

    async def _begin(self, fault: Fault, target: int) -> None:
        if fault.kind == "kill-relay":
            await asyncio.to_thread(self.relays[target].kill)
        elif fault.kind == relay_clock.KIND:
            assert self.relay_clock is not None
            offset = clock_offset(self.seed, fault.at_s, target)
            await asyncio.to_thread(self.relay_clock.begin, target, offset)
        elif fault.kind == "kill-device":
            assert self.fleet is not None
            await self.fleet.kill(target)
        elif fault.kind == "new-epoch":
            assert self.fleet is not None and self.epochs is not None
            await self.epochs.begin(self.fleet.users[target])
        else:
            await super()._begin(fault, target)

    async def _end(self, kind: str, target: int) -> None:
        if kind == "kill-relay":
            await asyncio.to_thread(self.relays[target].start)
        elif kind == relay_clock.KIND:
            assert self.relay_clock is not None
            await asyncio.to_thread(self.relay_clock.end, target)
        elif kind == "kill-device":
            assert self.fleet is not None
            self.fleet.restart(target)
        elif kind != "new-epoch":  # a new epoch stays: nothing to end
            await super()._end(kind, target)

    async def _prove(self, kind: str, target: int, history: HistoryWriter, when: str) -> bool:
        if kind not in E2E_KINDS:
            return await super()._prove(kind, target, history, when)
        if kind == "new-epoch":
            return await self._prove_epoch(target, history, when)
        if kind == relay_clock.KIND and when == "begin":
            return await self._prove_relay_clock(target, history)
        if kind in ("kill-relay", relay_clock.KIND):  # a clock fault's end: running again
            up = self.relays[target].running
        else:
            assert self.fleet is not None
            up = self.fleet.devices[target].alive
        ok = up if when == "end" else not up
        what = "running again" if up else "process gone"
        history.fault(kind, str(target), "proven" if ok else "no-effect", what)
        if not ok:
            print(f"  fault {kind}[{target}] without effect ({when}): {what}")
        return ok

    async def _prove_relay_clock(self, target: int, history: HistoryWriter) -> bool:
        assert self.relay_clock is not None
        try:
            found = await asyncio.to_thread(self.relay_clock.prove_begin, target)
        except Exception as exc:
            found = Proof(False, f"could not observe: {type(exc).__name__}")
        history.fault(relay_clock.KIND, str(target), "proven" if found.ok else "no-effect",
                      found.evidence)  # fmt: skip
        if not found.ok:
            print(f"  fault {relay_clock.KIND}[{target}] without effect: {found.evidence}")
        return found.ok

    async def _prove_epoch(self, target: int, history: HistoryWriter, when: str) -> bool:
        if when == "end":  # proven when it began; a new epoch has nothing to end
            return True
        assert self.fleet is not None and self.epochs is not None
        try:
            ok, what = await self.epochs.prove(self.fleet.users[target])
        except Exception as exc:
            ok, what = False, f"could not observe: {type(exc).__name__}"
        history.fault("new-epoch", str(target), "proven" if ok else "no-effect", what)
        if not ok:
            print(f"  fault new-epoch[{target}] without effect: {what}")
        return ok

    async def schedule(self, seed: int) -> tuple[int, int]:
        targets = [r.target for r in self.replicas]
        fleet = Fleet(seed, self.args.users, targets, self.work / f"devices-{seed}")
        self.fleet = fleet
        await fleet.start()
        versions = FrozenVersions()
        store: MailboxStore | None = None
        with contextlib.suppress(Exception):  # opened before any fault; none: the windows
            assert self.epochs is not None
            store = await self.epochs.store()

        async def read_versions() -> None:
            if store is not None:
                await versions.read(store, TENANT, fleet.users)
                versions.into(fleet.ledger)

        async def watch_versions(stop: asyncio.Event) -> None:
            while not stop.is_set():
                await read_versions()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), frozen.EVERY_S)

        stop = asyncio.Event()
        tasks = [asyncio.create_task(fleet.drive(stop))]
        tasks.append(asyncio.create_task(fleet.read_lanes(stop)))
        tasks.append(asyncio.create_task(watch_versions(stop)))
        try:
            own, por = await super().schedule(seed)
            stop.set()
            await asyncio.gather(*tasks)
            for relay in self.relays:
                await asyncio.to_thread(relay.start)
            settled = await fleet.settle(SETTLE_S, refresh=read_versions)
            await fleet.read_lanes(stop)  # once more: the lanes after the settle
            await read_versions()
            history = await fleet.history()
            statuses = {(d.user, d.device): await fleet.status(d) for d in fleet.devices}
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks)
            fleet.save(self.work / f"devices-{seed}.jsonl")
            await fleet.close()
            if self.epochs is not None:
                await self.epochs.close()
        found = delivery.check(fleet.ledger, history, fleet.devices, statuses)
        found.anomalies += versions.anomalies()
        found.verdict.settled_in_s = settled
        if settled < 0:
            found.anomalies.append(
                f"stuck: devices not settled (nothing changed for {STALL_S:.0f} s,"
                f" or {SETTLE_S:.0f} s passed)"
            )
        lane = lanes.check(fleet.reads)
        anomalies = lane.anomalies[:10] + found.anomalies + lane.anomalies[10:]
        c = fleet.counts
        outcomes = ", ".join(f"{k} x{n}" for k, n in sorted(found.verdict.outcomes.items()))
        print(f"  e2e: devices {len(fleet.devices)}, sends persisted"
              f" {c.get('send persisted', 0)}, refused before persist"
              f" {c.get('send refused', 0)}, to dead {c.get('send dead', 0)};"
              f" membership changes {c.get('membership change', 0)}; settled in {settled:.1f}s;"
              f" outcomes: {outcomes or 'none'}", flush=True)  # fmt: skip
        committed = sum(len(records) for records in history.values())
        known = sum(r.message_id in fleet.ledger.frozen for rs in history.values() for r in rs)
        print(f"  e2e: recipients judged at the frozen version for {known} of {committed}"
              f" messages (the rest by the windows); inbox reads {versions.reads}, cut short"
              f" {versions.failed}")  # fmt: skip
        print(f"  e2e: lane reads {lane.reads}, entries {lane.entries}, CursorExpired"
              f" {lane.expired}, sync errors {c.get('sync errors', 0)}; store messages"
              f" compared with History {found.held}")  # fmt: skip
        if settled < 0:  # where each device stood when the settle gave up
            states = ", ".join(f"{u}/{d} {s.get('state', '?')}, {len(s.get('pending', ()))}"
                               f" pending" for (u, d), s in sorted(statuses.items()))  # fmt: skip
            print(f"  e2e: devices at the end: {states}")
        for anomaly in anomalies[:20]:
            print(f"  e2e: {anomaly}")
        print(f"  e2e anomalies: {len(anomalies)} (delivery {len(found.anomalies)},"
              f" lanes {len(lane.anomalies)})", flush=True)  # fmt: skip
        return own + len(anomalies), por

    def close(self) -> None:
        for relay in self.relays:
            with contextlib.suppress(Exception):
                relay.kill()
        super().close()
