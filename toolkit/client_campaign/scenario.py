"""One seed of the client campaign.

Everything a seed does is drawn from ``Random(seed)``:

* a restartable in-process server (``MemoryServers``) whose mailboxes keep
  either 10,000 entries or only 6 (so cursors of clients that were down
  expire and they REBUILD);
* ``clients`` runtimes ``u0..`` over SQLite files; conversation ``c0`` holds
  them all, ``c1`` the first two;
* ``steps`` actions, each followed by a pause of up to 50 ms:

  =========  ================================================================
  send       a live client sends to one of its conversations
  arm        a live client arms one client fault point (it dies when it gets
             there: C-CLIENT-01 .. C-CLIENT-07)
  drop       a live client is dropped at once (a crash at no particular point)
  restart    a dead client starts again on its file, half of the time with a
             point armed that a starting runtime passes (reconciling,
             rebuilding, applying its first pages)
  corrupt    a dead client's file is given a newer schema version (it resets
             when it starts, keeping its pending sends)
  kill       the server is killed and started again; sometimes a committer
             fault (the ACK of the next commit is lost, or the commit stops
             after its record) or a relay fault (it dies half-way through a
             delivery) is armed first
  =========  ================================================================

then every fault is disarmed, the server restarted, the dead clients
started, and the seed waits (at most ``settle_s``) until every client is
ONLINE, has no pending send, and holds exactly the server's history of its
conversations.

What counts (``SeedResult``): *lost* is a send a client persisted that the
server's history does not hold, or a message of a conversation missing from
a member's store; *duplicated* is a (sender, cmid) held twice by the server
or by a store, or a message reported new twice by one client over all its
incarnations (MessagesAdded / SendConfirmed); *phantom* is a stored message
the server does not have. A seed that does not settle is *stuck*.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from client import (
    ClientEvent,
    ClientRuntimeError,
    ConnectionState,
    LocalStoreReset,
    MessagesAdded,
    RebuildFinished,
    RuntimeConfig,
    SendConfirmed,
    SendMessage,
)
from client.faults import ClientCrash, ClientPoint
from service.client import CommitClient, RetryPolicy
from service.domain.faults import FaultPoint, RelayPoint
from service.domain.model import MessageContent, MessageRecord, MessageType
from toolkit.client_campaign.history import whole_history
from toolkit.client_campaign.host import TENANT, ClientHost
from toolkit.client_campaign.servers import MemoryServers

CAMPAIGN_RUNTIME = RuntimeConfig(
    ack_timeout_s=2.0,
    rpc_timeout_s=2.0,
    heartbeat_s=1,
    pong_timeout_s=3.0,
    reconnect_initial_s=0.01,
    reconnect_max_s=0.1,
)
ACTIONS = ("send", "arm", "drop", "restart", "corrupt", "kill")
WEIGHTS = (50, 14, 4, 14, 2, 6)
SERVER_FAULTS = (
    None,
    FaultPoint.AFTER_COMMIT_BEFORE_ACK,
    FaultPoint.AFTER_PUT_RECORD,
    RelayPoint.MID_FANOUT,
)
START_POINTS = (
    ClientPoint.RESUMED_BEFORE_RESOLVE,
    ClientPoint.MID_REBUILD,
    ClientPoint.MID_BATCH,
    ClientPoint.AFTER_BATCH,
)
ADMIN_RETRY = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, deadline_s=10.0)


@dataclass(frozen=True)
class Options:
    clients: int = 3
    steps: int = 40
    settle_s: float = 60.0
    seed_timeout_s: float = 240.0
    """A seed still running after this is stopped and counted as stuck."""
    synchronous: str = "NORMAL"
    """SQLite durability of the campaign's stores: NORMAL survives a process crash
    in WAL mode (what the campaign simulates), FULL also a power cut."""


@dataclass
class SeedResult:
    seed: int
    sends: int = 0
    confirmed: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    server_kills: int = 0
    server_faults: Counter[str] = field(default_factory=Counter)
    rebuilds: int = 0
    resets: int = 0
    unexpected: Counter[str] = field(default_factory=Counter)
    """Exceptions a runtime's connection cycle did not expect (bugs), by class."""
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    stuck: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.stuck or self.unexpected)


class Seed:
    def __init__(self, seed: int, options: Options, workdir: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.options = options
        self.result = SeedResult(seed)
        small = self.rng.random() < 0.3
        self.servers = MemoryServers(mailbox_max_entries=6 if small else 10_000)
        users = [f"u{i}" for i in range(options.clients)]
        self.members = {"c0": users, "c1": users[:2]}
        self.hosts = [
            ClientHost(
                u,
                workdir / f"{u}.sqlite3",
                lambda: self.servers.target,
                config=CAMPAIGN_RUNTIME,
                synchronous=options.synchronous,
            )
            for u in users
        ]
        self.phase = "start"
        """What the seed is doing (reported when it is stuck)."""
        self.persisted: dict[str, tuple[str, str]] = {}
        """cmid -> (sender, conversation) of every send a client persisted."""
        self._next = 0

    async def run(self) -> SeedResult:
        started = time.monotonic()
        await self.servers.start()
        try:
            async with CommitClient.connect(self.servers.target, retry=ADMIN_RETRY) as c:
                for conversation, users in self.members.items():
                    await c.create_conversation(TENANT, conversation, users)
            for host in self.hosts:
                await host.start()
            for n in range(self.options.steps):
                action = self.rng.choices(ACTIONS, WEIGHTS)[0]
                self.phase = f"step {n}: {action}"
                await self.step(action)
                await asyncio.sleep(self.rng.uniform(0.0, 0.05))
                await self.reap()
            self.phase = "settle"
            await self.settle()
            self.phase = "check"
            await self.check()
        finally:
            self.phase = "teardown"
            for host in self.hosts:
                with contextlib.suppress(Exception):
                    await self.drop(host)
            await self.servers.kill()
        self.result.seconds = time.monotonic() - started
        return self.result

    # --- actions ------------------------------------------------------------------

    async def step(self, action: str) -> None:
        alive = [h for h in self.hosts if h.alive]
        dead = [h for h in self.hosts if h.runtime is None]
        if action == "send" and alive:
            await self.send(self.rng.choice(alive))
        elif action == "arm" and alive:
            self.rng.choice(alive).faults.arm(self.rng.choice(list(ClientPoint)))
        elif action == "drop" and alive:
            host = self.rng.choice(alive)
            self.result.crashes["dropped"] += 1
            await self.drop(host)
        elif action == "restart" and dead:
            host = self.rng.choice(dead)
            if self.rng.random() < 0.5:  # points a starting runtime passes first
                host.faults.arm(self.rng.choice(START_POINTS))
            await host.start()
        elif action == "corrupt" and dead:
            db = sqlite3.connect(self.rng.choice(dead).path)
            db.execute("PRAGMA user_version = 99")
            db.close()
        elif action == "kill":
            await self.kill()

    async def send(self, host: ClientHost) -> None:
        conversation = self.rng.choice(
            [c for c, users in self.members.items() if host.user in users]
        )
        self._next += 1
        cmid = f"s{self.seed}-{host.user}-{self._next}"
        body = f"seed {self.seed} message {self._next} " + "x" * self.rng.randrange(0, 200)
        message = SendMessage(conversation, MessageContent(MessageType.TEXT, body.encode()), cmid)
        try:
            await host.rt.send_message(message)
        except ClientCrash:
            pass  # C-CLIENT-01: it was persisted, then the client died
        except ClientRuntimeError:
            return  # the runtime had died already: nothing was persisted
        self.persisted[cmid] = (host.user, conversation)
        self.result.sends += 1

    async def kill(self) -> None:
        fault = self.rng.choice(SERVER_FAULTS)
        if fault is not None:
            self.servers.faults.arm(fault)
            self.result.server_faults[fault.value] += 1
            await asyncio.sleep(self.rng.uniform(0.0, 0.2))
        await self.servers.kill()
        self.result.server_kills += 1
        await asyncio.sleep(self.rng.uniform(0.0, 0.1))
        await self.servers.start()

    async def reap(self) -> None:
        """Clients that died at a fault point are dropped (their store closes)."""
        for host in self.hosts:
            if host.runtime is not None and host.runtime.crash is not None:
                self.result.crashes[host.runtime.crash.point.value] += 1
                await self.drop(host)

    async def drop(self, host: ClientHost) -> None:
        if host.runtime is not None:
            self.result.unexpected.update(host.runtime.unexpected)
        await host.crash()

    # --- settle and check ------------------------------------------------------------

    async def settle(self) -> None:
        for host in self.hosts:
            host.faults.disarm_all()
        self.servers.faults.disarm_all()
        await self.reap()
        await self.servers.restart()  # a relay stopped by its fault point runs again
        for host in self.hosts:
            if host.runtime is None:
                await host.start()
        deadline = time.monotonic() + self.options.settle_s
        while time.monotonic() < deadline:
            if await self.settled():
                return
            await asyncio.sleep(0.1)
        self.result.stuck = True
        self.result.problems.append("did not settle in time")

    async def settled(self) -> bool:
        for host in self.hosts:
            if host.runtime is None or host.runtime.state is not ConnectionState.ONLINE:
                return False
            if await host.rt.store.pending():
                return False
        server = await self.server_history()
        for host in self.hosts:
            for conversation, users in self.members.items():
                if host.user in users:
                    local = await host.rt.store.messages(conversation, limit=100_000)
                    if [m.record.message_id for m in local] != [
                        r.message_id for r in server[conversation]
                    ]:
                        return False
        return True

    async def server_history(self) -> dict[str, list[MessageRecord]]:
        found: dict[str, list[MessageRecord]] = {}
        async with CommitClient.connect(self.servers.target, retry=ADMIN_RETRY) as c:
            for conversation, users in self.members.items():
                found[conversation] = await whole_history(c, TENANT, conversation, users[0])
        return found

    async def check(self) -> None:
        r = self.result
        server = await self.server_history()
        held = Counter((m.sender, m.cmid) for records in server.values() for m in records)
        for cmid, (sender, _) in self.persisted.items():
            n = held[(sender, cmid)]
            if n == 0:
                r.lost += 1
                r.problems.append(f"lost: {cmid} is not in history")
            elif n > 1:
                r.duplicated += n - 1
                r.problems.append(f"duplicated: {cmid} is in history {n} times")
        strangers = set(held) - {(s, c) for c, (s, _) in self.persisted.items()}
        r.phantom += len(strangers)
        for host in self.hosts:
            await self.check_client(host, server)

    async def check_client(self, host: ClientHost, server: dict[str, list[MessageRecord]]) -> None:
        r = self.result
        for reported in reported_per_store(host.events):
            twice = [i for i, n in reported.items() if n > 1]
            r.duplicated += len(twice)
            r.problems += [f"duplicated: {host.user} reported {i} twice" for i in twice]
        for event in host.events:
            if isinstance(event, SendConfirmed):
                r.confirmed[event.via] += 1
            elif isinstance(event, RebuildFinished):
                r.rebuilds += 1
            elif isinstance(event, LocalStoreReset):
                r.resets += 1
        if host.runtime is None:
            return
        for conversation, users in self.members.items():
            if host.user not in users:
                continue
            local = [m.record for m in await host.rt.store.messages(conversation, limit=100_000)]
            keys = Counter((m.sender, m.cmid) for m in local)
            r.duplicated += sum(n - 1 for n in keys.values() if n > 1)
            mine = {m.message_id for m in local}
            theirs = {m.message_id for m in server[conversation]}
            if missing := theirs - mine:
                r.lost += len(missing)
                r.problems.append(f"lost: {host.user} lacks {len(missing)} of {conversation}")
            if extra := mine - theirs:
                r.phantom += len(extra)
                r.problems.append(f"phantom: {host.user} holds {len(extra)} unknown messages")


def reported_per_store(events: list[ClientEvent]) -> list[Counter[str]]:
    """Message ids reported new, counted per life of the local store: a
    LocalStoreReset empties it, so what is synced again is new again."""
    lives: list[Counter[str]] = [Counter()]
    for e in events:
        if isinstance(e, LocalStoreReset):
            lives.append(Counter())
        elif isinstance(e, MessagesAdded):
            lives[-1].update(m.message_id for m in e.messages)
        elif isinstance(e, SendConfirmed):
            lives[-1][e.message.message_id] += 1
    return lives


TEARDOWN_S = 30.0
"""How long a timed-out seed's teardown may take once cancelled."""

ABANDONED: set[asyncio.Task[SeedResult]] = set()
"""Seeds whose teardown hung after their timeout: left running, reported, never awaited."""


async def run_seed(seed: int, options: Options, workdir: Path) -> SeedResult:
    """One seed, bounded: after ``seed_timeout_s`` it is cancelled (stuck), and when its
    teardown does not end within ``TEARDOWN_S`` either, it is abandoned and the
    coroutine it hangs in is named."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    run = Seed(seed, options, workdir)
    task = asyncio.create_task(run.run(), name=f"client-campaign-seed-{seed}")
    done, _ = await asyncio.wait({task}, timeout=options.seed_timeout_s)
    if task in done:
        return task.result()
    run.result.stuck = True
    run.result.problems.append(f"timed out at {run.phase}, waiting in {hung_in(task)}")
    for host in run.hosts:  # where each runtime's connection cycle was
        cycle = host.runtime.cycle if host.runtime is not None else None
        if cycle is not None and not cycle.done():
            run.result.problems.append(f"{host.user}'s connection cycle in {hung_in(cycle)}")
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=TEARDOWN_S)
    if task not in done:
        ABANDONED.add(task)
        run.result.problems.append(f"its teardown hung in {hung_in(task)}")
    elif not task.cancelled() and task.exception() is not None:
        run.result.problems.append(f"its teardown failed: {type(task.exception()).__name__}")
    return run.result


def hung_in(task: asyncio.Task[Any]) -> str:
    """Where a task waits: the innermost frames of its await chain, outermost first."""
    frames: list[FrameType] = []
    awaited: Any = task.get_coro()
    for _ in range(100):  # the chain of coroutines each one awaits
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        if awaited is None:
            break
    if not frames:
        return "an unknown place"
    return " > ".join(
        f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}" for f in frames[-6:]
    )
