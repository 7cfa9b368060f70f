"""``ClientHost``: what a chat host does with one runtime, for tests and the campaign.

It opens the runtime over a SQLite file, connects, and records every event
in ``events`` (over every incarnation). ``crash`` drops the runtime as a
process death would (nothing is said to the server; the store file stays),
``start`` opens a new runtime on the same file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from client import (
    ClientEvent,
    ClientRuntime,
    ConnectRequest,
    GrpcConnector,
    MessagesAdded,
    RuntimeConfig,
    RuntimeStopped,
    SendConfirmed,
    open_local_store,
)
from client.faults import ClientFaults
from client.store import LocalStore
from client.transport import CallTimeouts, GrpcServerApi

TENANT = "acme"


@dataclass(frozen=True)
class LateTarget:
    """A connector that reads the server's address at each connection attempt."""

    target: Callable[[], str]

    def open(self, timeouts: CallTimeouts) -> GrpcServerApi:
        return GrpcConnector(self.target()).open(timeouts)


@dataclass
class ClientHost:
    user: str
    path: Path
    target: Callable[[], str]
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    device: str = "phone"
    tenant: str = TENANT
    synchronous: str = "FULL"
    faults: ClientFaults = field(default_factory=ClientFaults)
    runtime: ClientRuntime | None = None
    events: list[ClientEvent] = field(default_factory=list)
    incarnations: int = 0
    _reader: asyncio.Task[None] | None = None

    async def start(self, store: LocalStore | None = None) -> ClientRuntime:
        store = store or await open_local_store(
            self.path, synchronous=self.synchronous, faults=self.faults
        )
        runtime = ClientRuntime(
            store, LateTarget(self.target), config=self.config, faults=self.faults
        )
        self.runtime = runtime
        self.incarnations += 1
        await runtime.connect(ConnectRequest(self.tenant, self.user, self.device))
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
        assert self.runtime is not None, "the client is not running"
        return self.runtime

    @property
    def alive(self) -> bool:
        return self.runtime is not None and self.runtime.crash is None

    async def crash(self) -> None:
        """Drop the runtime: its store closes, nothing else happens."""
        if self.runtime is not None:
            await self.runtime.close()
            if self._reader is not None:
                await self._reader
        self.runtime = None

    async def restart(self) -> ClientRuntime:
        await self.crash()
        return await self.start()

    def added_ids(self) -> list[str]:
        """Message ids reported new (MessagesAdded, SendConfirmed), in report order."""
        ids = []
        for e in self.events:
            if isinstance(e, MessagesAdded):
                ids += [m.message_id for m in e.messages]
            elif isinstance(e, SendConfirmed):
                ids.append(e.message.message_id)
        return ids
