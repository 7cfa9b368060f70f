"""Real servers and real runtimes for the client tests.

``MemoryServers`` runs one in-process replica (``bootstrap.build_server``, its
relay inside) on a ``MemoryState`` that outlives it, so a test can kill the
server and start it again on the same port with every commit still there,
as a durable backend would. ``Client`` is one runtime over a SQLite file
with a recorder of its events; ``crash`` drops it without a word to the
server and ``restart`` opens a new runtime on the same file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from backends.memory import MemoryState, open_memory_backend
from client import (
    ClientEvent,
    ClientFaults,
    ClientRuntime,
    ConnectionState,
    ConnectRequest,
    GrpcConnector,
    MessagesAdded,
    RuntimeConfig,
    RuntimeStopped,
    SendConfirmed,
    SendMessage,
    open_local_store,
)
from client.store import LocalStore
from service.bootstrap import build_server
from service.client import CommitClient, RetryPolicy
from service.config import ServiceConfig
from service.domain.faults import FaultPoints
from service.domain.model import Direction, HistoryQuery, MessageContent, MessageRecord, MessageType
from service.domain.ports import Backend
from service.server import CommitServer
from toolkit.campaign.faulty import FaultyStore

TENANT = "acme"
SERVER_CONFIG = ServiceConfig(
    backend="memory",
    grpc_address="127.0.0.1:0",
    http_address="127.0.0.1:0",
    readiness_interval=0.05,
    recovery_interval=0.2,
    recovery_grace=0.1,
    shutdown_grace=0.5,
    sender_rate_per_s=0.0,
    subscribe_poll_interval=0.05,
    relay_idle_wait=0.05,
    relay_lease=1.0,
)
FAST = RuntimeConfig(
    ack_timeout_s=3.0,
    rpc_timeout_s=3.0,
    heartbeat_s=1,
    pong_timeout_s=3.0,
    reconnect_initial_s=0.02,
    reconnect_max_s=0.2,
)
ADMIN_RETRY = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, deadline_s=10.0)


def text(body: str) -> MessageContent:
    return MessageContent(MessageType.TEXT, body.encode())


class MemoryServers:
    """One in-process replica at a time on a memory state that survives it."""

    def __init__(self, **overrides: Any) -> None:
        self.state = MemoryState()
        self.config = replace(SERVER_CONFIG, **overrides)
        self.faults = FaultPoints()
        self.port = 0
        self.server: CommitServer | None = None
        self.store: FaultyStore | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        config = replace(self.config, grpc_address=f"127.0.0.1:{self.port}")
        inner = open_memory_backend(
            self.state,
            settings=config.store_settings(),
            mailbox=config.mailbox_settings(),
        )
        self.store = FaultyStore(inner.store)
        backend = replace(inner, store=self.store)
        self.server = build_server(config, backend, faults=self.faults)
        await self.server.start()
        self.port = self.server.grpc_port
        self.starts += 1

    async def kill(self) -> None:
        """Stop at once: in-flight calls are cancelled, nothing is drained."""
        if self.server is not None:
            await self.server.stop(grace_s=0.0)
            self.server = None

    async def restart(self) -> None:
        await self.kill()
        await self.start()

    def backend(self) -> Backend:
        assert self.server is not None
        return self.server.backend


async def admin(target: str) -> CommitClient:
    return CommitClient.connect(target, retry=ADMIN_RETRY)


async def history(target: str, conversation: str, actor: str) -> list[MessageRecord]:
    """Every record of a conversation, oldest first, read from the server."""
    records: list[MessageRecord] = []
    async with CommitClient.connect(target, retry=ADMIN_RETRY) as c:
        anchor = 0
        for _ in range(1000):
            page = await c.history(
                HistoryQuery(TENANT, conversation, actor, Direction.FORWARD, anchor, 200)
            )
            records += page.records
            if not page.next_anchor:
                return records
            anchor = page.next_anchor
    raise AssertionError("history did not end")


@dataclass
class Client:
    """One account's runtime over a SQLite file, and what it reported."""

    user: str
    path: Path
    target: Callable[[], str]
    config: RuntimeConfig = FAST
    device: str = "phone"
    faults: ClientFaults = field(default_factory=ClientFaults)
    runtime: ClientRuntime | None = None
    events: list[ClientEvent] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    async def start(self, store: LocalStore | None = None) -> ClientRuntime:
        store = store or await open_local_store(self.path, faults=self.faults)
        runtime = ClientRuntime(
            store,
            _LateTarget(self.target, self.config),
            config=self.config,
            faults=self.faults,
        )
        self.runtime = runtime
        await runtime.connect(ConnectRequest(TENANT, self.user, self.device))
        self._reader = asyncio.create_task(self._read(runtime))
        return runtime

    async def _read(self, runtime: ClientRuntime) -> None:
        while True:
            try:
                self.events.append(await runtime.next_event())
            except RuntimeStopped:
                return

    @property
    def rt(self) -> ClientRuntime:
        assert self.runtime is not None
        return self.runtime

    async def send(self, conversation: str, body: str, cmid: str | None = None) -> str:
        message = SendMessage(conversation, text(body))
        if cmid:
            message = replace(message, cmid=cmid)
        return (await self.rt.send_message(message)).cmid

    async def crash(self) -> None:
        """Drop the runtime as a crash would: its store closes, nothing else happens."""
        if self.runtime is not None:
            await self.runtime.close()
            if self._reader is not None:
                await self._reader
        self.runtime = None

    async def restart(self) -> ClientRuntime:
        await self.crash()
        return await self.start()

    async def online(self, timeout_s: float = 15.0) -> None:
        await eventually(lambda: _is(self.runtime, ConnectionState.ONLINE), timeout_s)

    def added_ids(self) -> list[str]:
        """Message ids reported new, over every incarnation, in report order."""
        ids = []
        for e in self.events:
            if isinstance(e, MessagesAdded):
                ids += [m.message_id for m in e.messages]
            elif isinstance(e, SendConfirmed):
                ids.append(e.message.message_id)
        return ids


@dataclass(frozen=True)
class _LateTarget:
    """A connector that reads the server's address at each connection attempt."""

    target: Callable[[], str]
    config: RuntimeConfig

    def open(self) -> Any:
        c = self.config
        return GrpcConnector(self.target(), c.ack_timeout_s, c.rpc_timeout_s).open()


async def _is(runtime: ClientRuntime | None, state: ConnectionState) -> bool:
    return runtime is not None and runtime.state is state


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    """Wait until ``check()`` is true (polling every 20 ms), or fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout_s}s")
