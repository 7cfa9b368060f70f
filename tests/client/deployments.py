"""Server deployments the end-to-end client scenarios run on, unchanged.

* ``memory``: one in-process replica with its relay inside, on a memory state
  that outlives it (``MemoryServers``): a kill stops the replica, a start
  builds a new one on the same state and port.
* ``redis`` and ``scylla``: real ``message-committer serve`` and ``relay``
  processes on the session's redis-server (a private key prefix) or CQL node
  (the session's keyspace, a tenant of the test's own); a kill is SIGKILL of
  the serve process, a start a new process on the same port.

``hold_delivery`` keeps the relay from writing any mailbox until
``release_delivery`` (memory: the relay stops at a fault point; processes:
the relay process is stopped), so a test can tell reconciliation from
delivery.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from backends.memory import open_memory_backend
from service.domain.mailbox import Mailbox
from tests.client.support import TENANT, MemoryServers, admin
from tests.e2e.process import RelayProcess, ServeProcess, run_cli
from tests.support import unique


class Deployment(Protocol):
    name: str
    tenant: str

    @property
    def target(self) -> str: ...

    async def start(self) -> None: ...

    async def kill(self) -> None: ...

    async def hold_delivery(self) -> None: ...

    async def release_delivery(self) -> None: ...

    async def new_epoch(self, user: str) -> None: ...

    async def close(self) -> None: ...


async def create(d: Deployment, conversation: str, members: list[str]) -> None:
    async with await admin(d.target) as c:
        await c.create_conversation(d.tenant, conversation, members)


class MemoryDeployment:
    name = "memory"
    tenant = TENANT

    def __init__(self, **overrides: Any) -> None:
        self.servers = MemoryServers(**overrides)

    @property
    def target(self) -> str:
        return self.servers.target

    async def start(self) -> None:
        await self.servers.start()

    async def kill(self) -> None:
        await self.servers.kill()

    async def hold_delivery(self) -> None:
        self.servers.hold_relay()

    async def release_delivery(self) -> None:
        self.servers.faults.disarm_all()
        await self.servers.restart()  # the held relay stopped at its fault point

    async def new_epoch(self, user: str) -> None:
        """What ``mailbox-new-epoch`` does, on the state the replica serves."""
        backend = open_memory_backend(self.servers.state)
        assert backend.delivery is not None
        await backend.delivery.mailbox.new_epoch(Mailbox.inbox(self.tenant, user))

    async def close(self) -> None:
        await self.servers.kill()


def _flags(overrides: dict[str, Any]) -> list[str]:
    """ServiceConfig overrides as serve/relay flags (floats are seconds)."""
    flags = []
    for name, value in overrides.items():
        flags += [
            f"--{name.replace('_', '-')}",
            f"{value}s" if isinstance(value, float) else str(value),
        ]
    return flags


FAST_SERVE = [
    "--subscribe-poll-interval",
    "50ms",
    "--recovery-interval",
    "200ms",
    "--recovery-grace",
    "100ms",
    "--sender-rate-per-s",
    "0",
]


class ProcessDeployment:
    """serve and relay processes on a backend they share."""

    def __init__(
        self, name: str, backend_args: list[str], env: dict[str, str], **overrides: Any
    ) -> None:
        self.name = name
        self.tenant = unique("t")
        self.backend_args = backend_args
        self.env = env
        self.flags = _flags(overrides)
        lease = "6s" if name == "scylla" else "2s"
        self.relay_flags = ["--relay-lease", lease, "--relay-idle-wait", "50ms"]
        self.relay_flags += ["--relay-first-retry", "200ms", "--relay-settle-window", "3s"]
        self.serve: ServeProcess | None = None
        self.relay: RelayProcess | None = None
        self.port = 0
        self.held = False

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        args = [*self.backend_args, *FAST_SERVE, *self.flags]
        args += ["--grpc-address", f"127.0.0.1:{self.port}"]
        self.serve = await asyncio.to_thread(ServeProcess, args, self.env)
        self.port = self.serve.grpc_port
        if not self.held and self.relay is None:
            await self._start_relay()

    async def _start_relay(self) -> None:
        args = [*self.backend_args, *self.relay_flags, *self.flags]
        self.relay = await asyncio.to_thread(RelayProcess, args, self.env)

    async def kill(self) -> None:
        if self.serve is not None:
            await asyncio.to_thread(self.serve.close)  # SIGKILL
            self.serve = None

    async def hold_delivery(self) -> None:
        self.held = True
        if self.relay is not None:
            await asyncio.to_thread(self.relay.terminate)  # releases its leases
            await asyncio.to_thread(self.relay.close)
            self.relay = None

    async def release_delivery(self) -> None:
        self.held = False
        await self._start_relay()

    async def new_epoch(self, user: str) -> None:
        """The operator's ``mailbox-new-epoch`` on ``user``'s inbox, as a process."""
        args = ["mailbox-new-epoch", *self.backend_args, "--tenant", self.tenant, "--user", user]
        done = await asyncio.to_thread(run_cli, args, self.env)
        assert done.returncode == 0, done.stderr

    async def close(self) -> None:
        await self.kill()
        if self.relay is not None:
            await asyncio.to_thread(self.relay.close)
            self.relay = None
