"""A restartable in-process server: one replica at a time on a memory state that
outlives it, so a kill loses nothing that was committed, as a durable backend
would not. A restart binds the same port, so clients reconnect to one address.

The replica is the real one (``bootstrap.build_server``, the in-process relay
inside), with the committer's and the relay's fault points shared across
restarts (``faults``) and its store wrapped to fail on demand (``store``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from backends.memory import MemoryState, open_memory_backend
from service.bootstrap import build_server
from service.config import ServiceConfig
from service.domain.faults import FaultPoints, RelayPoint
from service.server import CommitServer
from toolkit.campaign.faulty import FaultyStore

FAST_SERVER = ServiceConfig(
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
"""Short intervals: hints, deliveries and recovery within tens of milliseconds."""
HOLD_HITS = 1_000_000


class MemoryServers:
    """One in-process replica at a time on a memory state that survives it."""

    def __init__(self, **overrides: Any) -> None:
        self.state = MemoryState()
        self.config = replace(FAST_SERVER, **overrides)
        self.faults = FaultPoints()
        self.port = 0
        self.server: CommitServer | None = None
        self.store: FaultyStore | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.server is not None

    async def start(self) -> None:
        config = replace(self.config, grpc_address=f"127.0.0.1:{self.port}")
        inner = open_memory_backend(
            self.state, settings=config.store_settings(), mailbox=config.mailbox_settings()
        )
        self.store = FaultyStore(inner.store)
        self.server = build_server(config, replace(inner, store=self.store), faults=self.faults)
        await self.server.start()
        self.port = self.server.grpc_port
        self.starts += 1

    def hold_relay(self) -> None:
        """No deliveries until ``disarm_all`` and a restart: the relay stops at its next
        claim, and a relay started meanwhile stops at its takeover, before it could
        deliver what the stopped one had claimed (reconciliation passes no claim)."""
        self.faults.arm(RelayPoint.AFTER_CLAIM, times=HOLD_HITS)
        self.faults.arm(RelayPoint.AFTER_TAKEOVER, times=HOLD_HITS)

    async def kill(self) -> None:
        """Stop at once: in-flight calls are cancelled, nothing is drained."""
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop(grace_s=0.0)

    async def restart(self) -> None:
        await self.kill()
        await self.start()
