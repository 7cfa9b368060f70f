"""One seed of the process mode (``client-campaign --processes``).

Two users ``u0``, ``u1``, each with two devices ``a`` and ``b``: four device
processes (``device_proc``), each over its own SQLite file with
``synchronous=FULL``. Conversations: ``c0`` (both users), ``c1`` (``u0``; ``u1``
is added and removed during the seed), ``c2`` (``u0`` only: ``u1`` sending there
is a non-member). The server allows inline bodies of ``SERVER_BODY_MAX`` bytes.

Actions, drawn from ``Random(seed)``, each followed by a pause of up to 50 ms:

==========  ===================================================================
send        a live device sends to a conversation it is (believed) a member of
nonmember   a ``u1`` device sends to ``c2``: must end refused ``NotAMember``
oversize    a body over the server's limit (refused ``InvalidRequest``), or
            over the client's own (refused before it is persisted)
conflict    the other device of the same user sends an earlier send id again
            with other content: one ends confirmed, the other refused
            ``IdempotencyConflict``
arm         a live device arms a client fault point: it SIGKILLs itself there
kill        a live device is SIGKILLed at once (a random moment)
restart     a dead device starts a new process on its file, half of the time
            with a point armed that a starting runtime passes (C-CLIENT-07
            when its user's small mailbox got more sends than it holds
            while the device was down)
outlive     small-mailbox seeds: a live device is killed, the others send
            until the server answers its cursor with CursorExpired, and it
            restarts with C-CLIENT-07 (mid-REBUILD) armed
corrupt     a dead device's file: bytes overwritten in a page in the middle,
            or its ``user_version`` set to 99
member      ``u1`` is added to or removed from ``c1`` (through the server)
server      the server is killed and started again (memory: sometimes with a
            committer or relay fault armed first)
stall       the server process is stopped (SIGSTOP) for ``stall_s``, longer
            than the clients' ACK and PONG timeouts, then continued
==========  ===================================================================

A seed marked long-outage (``Options.outage_s``) also takes the server down
for that long with sends pending, once, mid-seed. Then every fault is
disarmed, the servers run, dead devices start, and the seed waits at most
``settle_s`` (the stated bound) for every device to be ONLINE with no pending
send that is not parked; ``proc_check`` judges the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.faults import ClientPoint
from service.client import CommitClient, RetryPolicy
from service.domain.errors import CommitError, CursorExpired
from service.domain.mailbox import INBOX, MailboxCursor
from service.domain.model import MessageRecord
from toolkit.client_campaign.device import TENANT
from toolkit.client_campaign.device_proc import DeviceProc, forkserver_context
from toolkit.client_campaign.history import whole_history
from toolkit.client_campaign.proc_check import Ledger, SendAttempt, Verdict, check, missing
from toolkit.client_campaign.server_procs import MemoryServerProc, RedisServerProcs, Servers

SERVER_BODY_MAX = 4096
SMALL_MAILBOX = 6
"""Entries a mailbox keeps in the seeds where cursors of devices that were down expire."""
EXPIRY_WAIT_S = 20.0
"""How long ``outlive`` waits for the relay to trim a mailbox past a dead device's
cursor, and then for the restarted device to die at C-CLIENT-07."""
POLL_S = 0.05
CLIENT_BODY_MAX = 64 * 1024
PROC_RUNTIME: dict[str, Any] = {
    "ack_timeout_s": 1.0,
    "rpc_timeout_s": 1.0,
    "heartbeat_s": 1,
    "pong_timeout_s": 1.5,
    "reconnect_initial_s": 0.02,
    "reconnect_max_s": 0.5,
    "retry_initial_s": 0.05,
    "retry_max_s": 0.5,
}
"""Short timeouts, so a stall of ``STALL_S`` trips the ACK and PONG timeouts."""
STALL_S = 2.0
ACTIONS = (
    "send",
    "nonmember",
    "oversize",
    "conflict",
    "arm",
    "kill",
    "restart",
    "corrupt",
    "member",
    "server",
    "stall",
    "outlive",
)
WEIGHTS = (40, 4, 4, 4, 10, 6, 14, 3, 4, 4, 2, 2)
MEMORY_FAULTS = ("", "M-COMMIT-06", "M-COMMIT-02", "R-RELAY-03")
START_POINTS = (
    ClientPoint.RESUMED_BEFORE_RESOLVE,
    ClientPoint.MID_REBUILD,
    ClientPoint.MID_BATCH,
    ClientPoint.AFTER_BATCH,
)
ADMIN_RETRY = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.5, deadline_s=90.0)
USERS = ("u0", "u1")
DEVICES = ("a", "b")


@dataclass(frozen=True)
class Options:
    backend: str = "memory"
    steps: int = 20
    settle_s: float = 30.0
    """The stated bound: every pending send confirmed or refused this long after
    the servers are back for good."""
    stall_s: float = STALL_S
    stalls: bool = True
    outage_s: float = 0.0
    """> 0: this seed also has one server outage this long, with sends pending."""
    seed_timeout_s: float = 150.0
    """A seed still running after this (plus ``outage_s``) is stopped and counted broken."""
    script: tuple[str, ...] = ()
    """When given, these actions in this order instead of ``steps`` drawn ones."""
    small: bool | None = None
    """Small mailboxes or not; None: drawn from the seed (3 seeds in 10)."""


@dataclass
class Fired:
    """What actually happened in a seed (a scheduled fault that never fired shows)."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


class ProcSeed:
    def __init__(
        self, seed: int, options: Options, workdir: Path, servers: Servers, *, small: bool = False
    ) -> None:
        self.seed = seed
        self.small = small
        """The servers keep ``SMALL_MAILBOX`` entries per mailbox."""
        self.rng = random.Random(seed)
        self.options = options
        self.workdir = workdir
        self.servers = servers
        self.context = forkserver_context()
        self.devices = [
            DeviceProc(u, d, workdir / f"{u}-{d}.sqlite3", self.context, PROC_RUNTIME)
            for u in USERS
            for d in DEVICES
        ]
        self.members: dict[str, set[str]] = {"c0": {"u0", "u1"}, "c1": {"u0"}, "c2": {"u0"}}
        self.ledger = Ledger(initial={c: set(m) for c, m in self.members.items()})
        self.fired = Fired()
        self.scheduled = Fired()
        self._next = 0
        self.phase = "start"
        self.waiting = ""
        self.down_since: dict[Path, int] = {}
        """Sends asked for when each dead device was first seen dead."""

    async def run(self) -> Verdict:
        await self.servers.start()
        async with CommitClient.connect(self.servers.target, retry=ADMIN_RETRY) as admin:
            self.admin = admin
            for conversation, users in self.members.items():
                await admin.create_conversation(TENANT, conversation, sorted(users))
            for d in self.devices:
                d.start(self.servers.target)
            outage_at = self.rng.randrange(self.options.steps) if self.options.outage_s else -1
            script = self.options.script
            for n in range(len(script) or self.options.steps):
                action = script[n] if script else self.rng.choices(ACTIONS, WEIGHTS)[0]
                self.phase = f"step {n}: {action}"
                await self.step(action)
                if n == outage_at:
                    await self.outage()
                await asyncio.sleep(self.rng.uniform(0.0, 0.05))
            self.phase = "settle"
            settled_in = await self.settle()
            self.phase = "check"
            history = await self.history()
            statuses = {(d.user, d.device): await self.status(d) for d in self.devices}
        verdict = check(self.ledger, history, self.devices, statuses)
        verdict.settled_in_s = settled_in
        if settled_in < 0:
            verdict.problems.insert(
                0, f"not settled in {self.options.settle_s:.0f} s: {self.waiting}"
            )
        for d in self.devices:
            for point in d.deaths():
                self.fired.add(f"kill at {point}")
            for e in d.events:
                if e["ev"] == "reset":  # said by the child at open, then by the runtime
                    said = "at open" if e.get("at") == "open" else "event"
                    kept = "LOST" if e["lost"] else "kept"
                    self.fired.add(f"store reset ({said}), pending {kept}")
                elif e["ev"] == "rebuilt":
                    self.fired.add("rebuild")
            self.fired.add("device processes", d.incarnations)
        verdict.fired = dict(self.fired.counts)
        verdict.scheduled = dict(self.scheduled.counts)
        return verdict

    # --- actions -------------------------------------------------------------------

    def live(self) -> list[DeviceProc]:
        return [d for d in self.devices if d.alive]

    async def step(self, action: str) -> None:
        for d in self.devices:
            if not d.alive:
                self.down_since.setdefault(d.path, len(self.ledger.attempts))
        live = self.live()
        dead = [d for d in self.devices if not d.alive]
        if action in ("send", "oversize", "conflict") and live:
            device = self.rng.choice(live)
            if action == "send":
                await self.send(device, self.conversation_of(device.user), "normal")
            elif action == "oversize":
                size = SERVER_BODY_MAX + 100 if self.rng.random() < 0.7 else CLIENT_BODY_MAX + 1
                await self.send(device, self.conversation_of(device.user), "oversize", size=size)
            else:
                await self.conflict(device)
        elif action == "nonmember":
            u1 = [d for d in live if d.user == "u1"]
            if u1:
                await self.send(self.rng.choice(u1), "c2", "nonmember")
        elif action == "arm" and live:
            point = self.rng.choice(list(ClientPoint)).value
            self.scheduled.add(f"kill at {point}")
            await self.rng.choice(live).command(op="arm", point=point)
        elif action == "kill" and live:
            self.fired.add("kill at random")
            await self.rng.choice(live).kill()
        elif action == "restart" and dead:
            device = self.rng.choice(dead)
            arm: tuple[str, ...] = ()
            died = device.deaths()
            if died and died[-1] in (ClientPoint.ATTEMPT_BEFORE_SEND, ClientPoint.SENT_BEFORE_ACK):
                arm = (ClientPoint.RESUMED_BEFORE_RESOLVE.value,)  # it resumes a send now
                self.scheduled.add(f"kill at {arm[0]}")
            elif self.small and self._sent_while_down(device) > SMALL_MAILBOX:
                arm = (ClientPoint.MID_REBUILD.value,)  # its cursor has likely expired
                self.scheduled.add(f"kill at {arm[0]}")
            elif self.rng.random() < 0.5:
                arm = (self.rng.choice(START_POINTS).value,)
                self.scheduled.add(f"kill at {arm[0]}")
            await device.kill()  # reap one that died at its point
            self.restart(device, arm)
        elif action == "corrupt" and dead:
            device = self.rng.choice(dead)
            await device.kill()
            what = corrupt(device.path, self.rng)
            self.fired.add(what)
            device.events.append({"ev": "corrupted", "what": what})
        elif action == "member":
            await self.membership()
        elif action == "server":
            await self.server_kill()
        elif action == "outlive" and self.small:
            await self.outlive()
        elif action == "stall" and self.options.stalls:
            seen = [len(d.events) for d in self.devices]
            await self.servers.stall(self.options.stall_s)
            self.fired.add("server stall")
            for d, n in zip(self.devices, seen, strict=True):  # only a timeout ends ONLINE here
                if any(e == {"ev": "state", "state": "disconnected"} for e in d.events[n:]):
                    self.fired.add("device timed out during a stall (ACK, PONG or RPC)")

    def restart(self, device: DeviceProc, arm: tuple[str, ...] = ()) -> None:
        device.start(self.servers.target, arm)
        self.down_since.pop(device.path, None)

    def _sent_while_down(self, device: DeviceProc) -> int:
        return len(self.ledger.attempts) - self.down_since.get(device.path, 0)

    async def outlive(self) -> None:
        """A device down while its user's small mailbox trims past its cursor, then
        restarted with C-CLIENT-07 armed: its REBUILD dies after a backfill."""
        live = self.live()
        if len(live) < 2:
            return
        synced = [d for d in live if stored_cursor(d.path) is not None]
        victim = self.rng.choice(synced or live)
        senders = [d for d in live if d is not victim]
        await victim.kill()
        # what its next Sync will send: the stored cursor, or the lane's start
        cursor = stored_cursor(victim.path) or MailboxCursor(INBOX)
        self.fired.add("outlive: device killed")
        for _ in range(4 * SMALL_MAILBOX):
            if await self.expired(victim.user, cursor):
                break
            if alive := [d for d in senders if d.alive]:
                await self.send(self.rng.choice(alive), "c0", "normal")
        if not await _within(lambda: self.expired(victim.user, cursor), EXPIRY_WAIT_S):
            self.fired.add("outlive: cursor still valid (sends refused or not delivered)")
            return
        self.fired.add("outlive: cursor expired while down")
        self.scheduled.add(f"kill at {ClientPoint.MID_REBUILD.value}")
        self.restart(victim, (ClientPoint.MID_REBUILD.value,))
        if not await _within(_dead(victim), EXPIRY_WAIT_S):  # it syncs, rebuilds, dies there
            self.fired.add("outlive: restarted, still alive (C-CLIENT-07 not reached)")

    async def expired(self, user: str, cursor: MailboxCursor) -> bool:
        """Whether the server answers a Sync from ``cursor`` with CursorExpired."""
        try:
            await self.admin.sync(TENANT, user, cursor, limit=1)
        except CursorExpired:
            return True
        except CommitError:
            return False  # the server is down or busy: not known yet
        return False

    def conversation_of(self, user: str) -> str:
        return self.rng.choice(sorted(c for c, m in self.members.items() if user in m))

    async def send(
        self, device: DeviceProc, conversation: str, kind: str, *, cmid: str = "", size: int = 0
    ) -> None:
        if not cmid:
            self._next += 1
            cmid = f"s{self.seed}-{device.user}{device.device}-{self._next}"
        size = size or self.rng.randrange(1, 300)
        attempt = SendAttempt(device.user, device.device, cmid, conversation, size, kind)
        attempt.at = len(device.events)
        self.ledger.record(attempt, time.time())
        deaths = len(device.deaths())
        reply = await device.command(op="send", conversation=conversation, cmid=cmid, size=size)
        died = device.deaths()[deaths:]
        if reply["ev"] == "dead" and died == [ClientPoint.AFTER_PERSIST.value]:
            reply = {"ev": "persisted", "died": died[0]}  # it died right after persisting it
        attempt.reply = reply
        if reply["ev"] == "refused":
            self.fired.add(f"refused before persist: {reply['error']}")

    async def conflict(self, device: DeviceProc) -> None:
        """Both devices of a user send one send id at once, with other contents: one
        ends confirmed, the other refused (by the server, or locally when the other
        device's message reached it first)."""
        others = [d for d in self.live() if d.user == device.user and d.device != device.device]
        if not others:
            return
        self._next += 1
        cmid = f"s{self.seed}-{device.user}-twin-{self._next}"
        conversation = self.conversation_of(device.user)
        size = self.rng.randrange(1, 300)
        self.scheduled.add("conflict")
        await asyncio.gather(
            self.send(device, conversation, "conflict", cmid=cmid, size=size),
            self.send(others[0], conversation, "conflict", cmid=cmid, size=size + 1),
        )

    async def membership(self) -> None:
        before = time.time()
        if "u1" in self.members["c1"]:
            await self.admin.remove_members(TENANT, "c1", ["u1"])
            self.members["c1"].discard("u1")
        else:
            await self.admin.add_members(TENANT, "c1", ["u1"])
            self.members["c1"].add("u1")
        self.ledger.membership("c1", "u1", "u1" in self.members["c1"], before, time.time())
        self.fired.add("membership change")

    async def server_kill(self) -> None:
        if self.options.backend == "memory":
            fault = self.rng.choice(MEMORY_FAULTS)
            if fault and await self.servers.arm(fault):
                self.fired.add(f"server fault armed {fault}")
                await asyncio.sleep(self.rng.uniform(0.0, 0.2))
        await self.servers.kill()
        self.fired.add("server kill")
        await asyncio.sleep(self.rng.uniform(0.0, 0.1))
        await self.servers.start()

    async def outage(self) -> None:
        """Sends first, then the server down for ``outage_s``: nobody may give up."""
        for d in self.live():
            await self.send(d, self.conversation_of(d.user), "normal")
        await self.servers.kill()
        await asyncio.sleep(self.options.outage_s)
        await self.servers.start()
        self.fired.add("long outage")

    # --- settle ----------------------------------------------------------------------

    async def settle(self) -> float:
        """Seconds from the servers' last start until settled (the bound: ``settle_s``)."""
        await self.servers.disarm()
        if self.options.backend == "memory":  # a relay stopped at its fault point runs again
            await self.servers.kill()
            await self.servers.start()
        for d in self.devices:
            await d.command(op="disarm")
        began = time.monotonic()
        deadline = began + self.options.settle_s
        while time.monotonic() < deadline:
            for d in self.devices:  # dead, or died at a point armed before the disarm
                if not d.alive:
                    await d.kill()
                    self.restart(d)
            if await self.settled():
                return time.monotonic() - began
            await asyncio.sleep(0.1)
        self.unsettled = True
        return -1.0

    async def settled(self) -> bool:
        statuses = []
        for d in self.devices:
            status = await self.status(d)
            if status.get("state") != "online":
                self.waiting = f"{d.user}/{d.device} is {status.get('state', status['ev'])}"
                return False
            if waiting := set(status["pending"]) - set(status["parked"]):
                self.waiting = f"{d.user}/{d.device} has {len(waiting)} pending"
                return False
            statuses.append((d.user, status))
        history = await self.history()
        for u, status in statuses:
            if lacking := missing(self.ledger, history, u, status):
                self.waiting = f"a device of {u} lacks {len(lacking)} messages"
                return False
        return True

    async def status(self, d: DeviceProc) -> dict[str, Any]:
        return await d.command(op="status", conversations=sorted(self.members))

    async def history(self) -> dict[str, list[MessageRecord]]:
        found: dict[str, list[MessageRecord]] = {}
        for conversation in self.members:
            found[conversation] = await whole_history(self.admin, TENANT, conversation, "u0")
        return found

    async def teardown(self) -> None:
        for d in self.devices:
            with contextlib.suppress(Exception):
                await d.kill()
        with contextlib.suppress(Exception):
            await self.servers.close()


async def _within(check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    """Whether ``check`` came true within ``timeout_s`` (asked every ``POLL_S``)."""
    for _ in range(int(timeout_s / POLL_S)):
        if await check():
            return True
        await asyncio.sleep(POLL_S)
    return await check()


def _dead(device: DeviceProc) -> Callable[[], Awaitable[bool]]:
    async def dead() -> bool:
        return not device.alive

    return dead


def stored_cursor(path: Path) -> MailboxCursor | None:
    """A dead device's inbox cursor, read from its file (None: it has none yet)."""
    if not path.exists():
        return None
    db = sqlite3.connect(path)
    try:
        row = db.execute("SELECT epoch, seq FROM cursors WHERE lane = ?", (INBOX,)).fetchone()
    except sqlite3.DatabaseError:
        return None  # damaged by an earlier corrupt action
    finally:
        db.close()
    return None if row is None else MailboxCursor(INBOX, int(row[0]), int(row[1]))


def corrupt(path: Path, rng: random.Random) -> str:
    """Damage a dead device's file: garbage over the start of a b-tree page in the
    middle (after a checkpoint, so the pages are in the file), or the schema
    version set to 99."""
    if not path.exists():
        return "corrupt skipped (no file)"
    db = sqlite3.connect(path)
    try:
        if rng.random() < 0.3:
            db.execute("PRAGMA user_version = 99")
            return "corrupt user_version"
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
        pages = int(db.execute("PRAGMA page_count").fetchone()[0])
    finally:
        db.close()
    if pages < 3:
        return "corrupt skipped (file too small)"
    page = rng.randrange(2, pages)  # 1-based; never the header page
    with path.open("r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(bytes(rng.randrange(256) for _ in range(64)))
    return "corrupt page"


async def run_proc_seed(seed: int, options: Options, workdir: Path) -> Verdict:
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    servers: Servers
    small = random.Random(seed).random() < 0.3  # cursors of devices that were down expire
    if options.small is not None:
        small = options.small
    if options.backend == "redis":
        servers = RedisServerProcs(
            workdir, {**REDIS_ENV, **SMALL_MAILBOX_ENV} if small else REDIS_ENV
        )
    else:
        overrides: dict[str, Any] = {"max_inline_body_bytes": SERVER_BODY_MAX}
        if small:
            overrides["mailbox_max_entries"] = SMALL_MAILBOX
        servers = MemoryServerProc(forkserver_context(), **overrides)
    run = ProcSeed(seed, options, workdir, servers, small=small)
    began = time.monotonic()
    try:
        if isinstance(servers, RedisServerProcs):
            await servers.initialise()
        verdict = await asyncio.wait_for(run.run(), options.seed_timeout_s + options.outage_s)
    except TimeoutError:
        verdict = Verdict(seed=seed, broken=True)
        verdict.problems.append(f"timed out at {run.phase}")
    except Exception as exc:  # a seed that broke is reported, never hidden
        verdict = Verdict(seed=seed)
        verdict.problems.append(f"seed failed at {run.phase}: {type(exc).__name__}: {exc}")
        verdict.broken = True
    finally:
        await run.teardown()
    verdict.seed = seed
    verdict.seconds = time.monotonic() - began
    return verdict


REDIS_ENV = {
    "MC_RELAY_HTTP_ADDRESS": "127.0.0.1:0",  # never the default port another relay may hold
    "MC_MAX_INLINE_BODY_BYTES": str(SERVER_BODY_MAX),
    "MC_SENDER_RATE_PER_S": "0",
    "MC_READINESS_INTERVAL": "100ms",
    "MC_SHUTDOWN_GRACE": "500ms",
    "MC_RELAY_IDLE_WAIT": "50ms",
    "MC_RELAY_LEASE": "1s",
    "MC_SUBSCRIBE_POLL_INTERVAL": "50ms",
    "MC_RECOVERY_INTERVAL": "200ms",
    "MC_RECOVERY_GRACE": "100ms",
}
SMALL_MAILBOX_ENV = {"MC_MAILBOX_MAX_ENTRIES": str(SMALL_MAILBOX)}
