"""The run's users and devices: client runtimes as processes, their sends, the lane readers.

``Fleet`` has ``users`` users with two devices each (``client_campaign.device_proc``:
a ``ClientRuntime`` over its own SQLite file, SIGKILLed and restarted by the nemesis's
``kill-device`` fault), spread over the serve replicas. Conversation ``k`` has every
user as a member but ``u<k mod users>``'s removal and return come as membership
changes during the run. ``drive`` sends from random live devices, each send recorded
with its invoke and return times (``ops``); ``read_lanes`` Syncs every user's inbox
through random replicas (during the faults too) into ``lanes.LaneRead``s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from client.faults import ClientPoint
from service.client import NO_RETRY, CommitClient, RetryPolicy
from service.domain.errors import CommitError, CursorExpired
from service.domain.mailbox import INBOX, MailboxCursor
from service.domain.model import MessageRecord
from toolkit.client_campaign.device import TENANT
from toolkit.client_campaign.device_proc import DeviceProc, forkserver_context
from toolkit.client_campaign.history import whole_history
from toolkit.client_campaign.proc_check import Ledger, SendAttempt, missing
from toolkit.client_campaign.proc_scenario import PROC_RUNTIME
from toolkit.nemesis.e2e.lanes import LaneRead

ADMIN_RETRY = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=1.0, deadline_s=60.0)
SEND_PAUSE_S = (0.05, 0.25)
MEMBERSHIP_EVERY = 25
"""One membership change every this many sends."""
TWINS_EVERY = 7
"""Every this many sends, both devices of a user send one cmid with other contents
at once: one ends confirmed, the other refused (never confirmed by the other's)."""
READ_PAUSE_S = 0.3
LATE_TWIN_CONFIRM_S = 10.0
LATE_TWIN_WAIT_S = 1.5
# The settle gives up after this long without any change (the e2e relays' lease is 2 s).
STALL_S = 10.0
"""How long a late twin's device stays down after its twin was confirmed: the
twin's message reaches the inbox before the restarted device's first Sync."""


class Fleet:
    def __init__(self, seed: int, users: int, targets: list[str], work: Path) -> None:
        self.rng = random.Random(seed)
        self.targets = targets
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        context = forkserver_context()
        self.users = [f"s{seed}u{i}" for i in range(users)]
        self.devices = [
            DeviceProc(u, d, work / f"{u}-{d}.sqlite3", context, PROC_RUNTIME)
            for u in self.users
            for d in ("a", "b")
        ]
        self.members = {f"s{seed}c{k}": set(self.users) for k in range(max(1, users - 1))}
        self.ledger = Ledger(initial={c: set(m) for c, m in self.members.items()})
        self.ops: list[dict[str, Any]] = []
        self.reads: list[LaneRead] = []
        self.counts: dict[str, int] = {}
        self._serial = 0

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def target_of(self, device: DeviceProc) -> str:
        return self.targets[self.devices.index(device) % len(self.targets)]

    async def start(self) -> None:
        async with CommitClient.connect(self.targets[0], retry=ADMIN_RETRY) as admin:
            for conversation, users in self.members.items():
                await admin.create_conversation(TENANT, conversation, sorted(users))
        for d in self.devices:
            d.start(self.target_of(d))

    # --- faults ------------------------------------------------------------------

    async def kill(self, index: int) -> bool:
        """SIGKILL device ``index``; whether its process is gone."""
        device = self.devices[index]
        process = device._process
        await device.kill()
        return process is None or not process.is_alive()

    def restart(self, index: int) -> bool:
        device = self.devices[index]
        if not device.running:
            device.start(self.target_of(device))
        return device.alive

    # --- the workload -------------------------------------------------------------

    async def drive(self, stop: asyncio.Event) -> None:
        async with CommitClient.connect(self.targets[0], retry=ADMIN_RETRY) as admin:
            while not stop.is_set():
                self._serial += 1
                if self._serial % MEMBERSHIP_EVERY == 0:
                    await self.membership(admin)
                live = [d for d in self.devices if d.alive]
                if live and self._serial % (2 * TWINS_EVERY) == 0:
                    await self.late_twin(self.rng.choice(live))
                elif live and self._serial % TWINS_EVERY == 0:
                    await self.twins(self.rng.choice(live))
                elif live:
                    await self.send(self.rng.choice(live))
                await asyncio.sleep(self.rng.uniform(*SEND_PAUSE_S))

    async def twins(self, device: DeviceProc) -> None:
        other = next(d for d in self.devices if d.user == device.user and d is not device)
        mine = sorted(c for c, m in self.members.items() if device.user in m)
        if not other.alive or not mine:
            return
        conversation, cmid = self.rng.choice(mine), f"{device.user}-twin-{self._serial}"
        size = self.rng.randrange(1, 300)
        await asyncio.gather(
            self.send(device, conversation=conversation, cmid=cmid, size=size, kind="conflict"),
            self.send(other, conversation=conversation, cmid=cmid, size=size + 1, kind="conflict"),
        )

    async def late_twin(self, device: DeviceProc) -> None:
        """The other device persists a cmid and dies before sending it; this one sends
        the cmid with other contents; the other restarts when that message is in the
        user's inbox: its pending send must end refused, never confirmed by it."""
        other = next(d for d in self.devices if d.user == device.user and d is not device)
        mine = sorted(c for c, m in self.members.items() if device.user in m)
        if not other.alive or not mine:
            return
        conversation, cmid = self.rng.choice(mine), f"{device.user}-late-{self._serial}"
        size = self.rng.randrange(1, 300)
        await other.command(op="arm", point=ClientPoint.ATTEMPT_BEFORE_SEND.value)
        await self.send(other, conversation=conversation, cmid=cmid, size=size, kind="conflict")
        await self.send(
            device, conversation=conversation, cmid=cmid, size=size + 1, kind="conflict"
        )
        for _ in range(int(LATE_TWIN_CONFIRM_S / 0.1)):  # its ACK came: it is committed
            if any(e["ev"] == "confirmed" and e["cmid"] == cmid for e in device.events):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(LATE_TWIN_WAIT_S)  # and the relay put it in the inbox
        await other.kill()
        other.start(self.target_of(other))
        self.count("late twins")

    async def send(
        self,
        device: DeviceProc,
        *,
        conversation: str = "",
        cmid: str = "",
        size: int = 0,
        kind: str = "normal",
    ) -> None:
        mine = sorted(c for c, m in self.members.items() if device.user in m)
        if not mine:
            return
        conversation = conversation or self.rng.choice(mine)
        cmid = cmid or f"{device.user}{device.device}-{self._serial}"
        size = size or self.rng.randrange(1, 300)
        attempt = SendAttempt(device.user, device.device, cmid, conversation, size, kind)
        attempt.at = len(device.events)
        invoked = time.time()
        self.ledger.record(attempt, invoked)
        reply = await device.command(op="send", conversation=conversation, cmid=cmid, size=size)
        attempt.reply = reply
        self.count(f"send {reply['ev']}")
        self.ops.append({"op": "send", "device": f"{device.user}/{device.device}", "cmid": cmid,
                         "conversation": conversation, "invoke": invoked,
                         "return": time.time(), "reply": reply["ev"]})  # fmt: skip

    async def membership(self, admin: CommitClient) -> None:
        conversation = self.rng.choice(sorted(self.members))
        user = self.users[sorted(self.members).index(conversation) % len(self.users)]
        before = time.time()
        adding = user not in self.members[conversation]
        try:
            if adding:
                answer = await admin.add_members(TENANT, conversation, [user])
            else:
                answer = await admin.remove_members(TENANT, conversation, [user])
        except CommitError:  # unknown outcome: its version unknown, its user not judged
            self.count("membership unknown")
            self.ledger.membership(conversation, user, adding, before, float("inf"))
            return
        (self.members[conversation].add if adding else self.members[conversation].discard)(user)
        after = time.time()
        self.ledger.membership(conversation, user, adding, before, after, answer.version)
        self.count("membership change")
        op = "add" if adding else "remove"
        self.ops.append({"op": op, "user": user, "conversation": conversation,
                         "invoke": before, "return": after,
                         "version": answer.version})  # fmt: skip

    async def read_lanes(self, stop: asyncio.Event) -> None:
        cursors = {u: MailboxCursor(INBOX) for u in self.users}
        clients = [CommitClient.connect(t, retry=NO_RETRY) for t in self.targets]
        async with contextlib.AsyncExitStack() as stack:
            opened = [await stack.enter_async_context(c) for c in clients]
            while True:
                for user in self.users:
                    client = self.rng.choice(opened)
                    cursors[user] = await self.read_lane(client, user, cursors[user])
                if stop.is_set():
                    return
                await asyncio.sleep(READ_PAUSE_S)

    async def read_lane(
        self, client: CommitClient, user: str, cursor: MailboxCursor
    ) -> MailboxCursor:
        lane = f"inbox:{user}"
        for _ in range(100):
            try:
                page = await client.sync(TENANT, user, cursor)
            except CursorExpired:
                self.reads.append(LaneRead(lane, cursor.epoch, cursor.seq, expired=True))
                return MailboxCursor(INBOX)
            except CommitError:
                self.count("sync errors")
                return cursor
            self.count("syncs")
            entries = tuple((e.seq, e.record.message_id) for e in page.entries)
            withheld = tuple(seq for seq, _ in page.withheld)
            nxt = page.next_cursor
            self.reads.append(LaneRead(lane, cursor.epoch, cursor.seq, entries, withheld,
                                       nxt.epoch, nxt.seq))  # fmt: skip
            cursor = nxt
            if not page.more:
                break
        return cursor

    # --- settling -------------------------------------------------------------------

    async def settle(
        self,
        timeout_s: float,
        stall_s: float = STALL_S,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> float:
        """Seconds until every device is online with nothing pending and nothing
        missing (dead ones restarted); -1 when ``timeout_s`` passed first, or when for
        ``stall_s`` every device was online and nothing it holds, lacks or has pending
        changed: a relay that skipped an entry never delivers it, and waiting out the
        whole timeout for it only makes a caught run slower. ``refresh`` runs before
        each look (the messages' frozen versions, which decide what is missing)."""
        for d in self.devices:
            await d.command(op="disarm")
        began = time.monotonic()
        last: tuple[object, ...] | None = None
        since = began
        while time.monotonic() - began < timeout_s:
            for i, d in enumerate(self.devices):
                if not d.alive:
                    await d.kill()
                    self.restart(i)
            if refresh is not None:
                await refresh()
            done, seen = await self._settle_state()
            now = time.monotonic()
            if done:
                return now - began
            if seen is None or seen != last:
                last, since = seen, now
            elif now - since >= stall_s:
                return -1.0
            await asyncio.sleep(0.5)
        return -1.0

    async def _settle_state(self) -> tuple[bool, tuple[object, ...] | None]:
        """Whether the fleet has settled, and what it holds, lacks and has pending
        (None while a device is not online: a restart is progress still to come)."""
        history = await self.history()
        done = True
        seen: list[object] = []
        for d in self.devices:
            status = await self.status(d)
            if status.get("state") != "online":
                return False, None
            pending = sorted(set(status["pending"]) - set(status["parked"]))
            lacking = missing(self.ledger, history, d.user, status)
            done = done and not pending and not lacking
            held = sorted((c, len(ids)) for c, ids in status.get("held", {}).items())
            seen.append((pending, sorted(lacking), held))
        return done, (tuple(seen), tuple(sorted((c, len(r)) for c, r in history.items())))

    async def status(self, d: DeviceProc) -> dict[str, Any]:
        return await d.command(op="status", conversations=sorted(self.members))

    async def history(self) -> dict[str, list[MessageRecord]]:
        found: dict[str, list[MessageRecord]] = {}
        async with CommitClient.connect(self.targets[0], retry=ADMIN_RETRY) as admin:
            for conversation, users in self.ledger.initial.items():
                actor = sorted(users)[-1]  # never the one whose membership changes
                found[conversation] = await whole_history(admin, TENANT, conversation, actor)
        return found

    def save(self, path: Path) -> None:
        with path.open("w") as f:
            for op in self.ops:
                f.write(json.dumps(op) + "\n")

    async def close(self) -> None:
        for d in self.devices:
            with contextlib.suppress(Exception):
                await d.kill()
