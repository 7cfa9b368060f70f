"""Server deployments the end-to-end client scenarios run on, unchanged.

* ``memory``: one in-process replica with its relay inside, on a memory state
  that outlives it (``MemoryServers``): a kill stops the replica, a start
  builds a new one on the same state and port.
* ``redis``: a real ``message-committer serve --backend redis`` process on a
  private key prefix of the session's redis-server, killed with SIGKILL and
  started again as a new process; the outbox relay runs in the test process
  (a real ``RelayRunner`` on its own Redis connection), since the serve
  process runs no relay on a shared backend.

``hold_delivery`` keeps the relay from writing any mailbox until
``release_delivery``, so a test can tell reconciliation from delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from service.bootstrap import open_backend
from service.config import ServiceConfig
from service.domain.faults import RelayPoint
from service.domain.ports import Backend
from service.relay import RelayRunner
from service.relay_metrics import RelayMetrics
from tests.client.support import SERVER_CONFIG, TENANT, MemoryServers, admin
from tests.e2e.process import ServeProcess

HOLD = 1_000_000


class Deployment(Protocol):
    name: str

    @property
    def target(self) -> str: ...

    async def start(self) -> None: ...

    async def kill(self) -> None: ...

    async def hold_delivery(self) -> None: ...

    async def release_delivery(self) -> None: ...

    async def close(self) -> None: ...


async def create(d: Deployment, conversation: str, members: list[str]) -> None:
    async with await admin(d.target) as c:
        await c.create_conversation(TENANT, conversation, members)


class MemoryDeployment:
    name = "memory"

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
        self.servers.faults.arm(RelayPoint.AFTER_CLAIM, times=HOLD)

    async def release_delivery(self) -> None:
        self.servers.faults.disarm_all()
        await self.servers.restart()  # the held relay stopped at its fault point

    async def close(self) -> None:
        await self.servers.kill()


def _flags(overrides: dict[str, Any]) -> list[str]:
    flags = []
    for name, value in overrides.items():
        flags += [
            f"--{name.replace('_', '-')}",
            f"{value}s" if isinstance(value, float) else str(value),
        ]
    return flags


class RedisDeployment:
    name = "redis"

    def __init__(self, url: str, prefix: str, **overrides: Any) -> None:
        self.url = url
        self.prefix = prefix
        self.overrides = overrides
        self.config = replace(
            SERVER_CONFIG, backend="redis", redis_url=url, redis_prefix=prefix, **overrides
        )
        self.process: ServeProcess | None = None
        self.port = 0
        self._relay_backend: Backend | None = None
        self._relay: RelayRunner | None = None
        self._relay_task: asyncio.Task[None] | None = None
        self._relay_stop = asyncio.Event()
        self._held = False

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        c = self.config
        args = [
            "--backend",
            "redis",
            "--redis-prefix",
            self.prefix,
            "--grpc-address",
            f"127.0.0.1:{self.port}",
            "--subscribe-poll-interval",
            "50ms",
            "--recovery-interval",
            "200ms",
            "--recovery-grace",
            "100ms",
            "--sender-rate-per-s",
            "0",
            *_flags(self.overrides),
        ]
        env = {"MC_REDIS_URL": self.url}
        self.process = await asyncio.to_thread(ServeProcess, args, env)
        self.port = self.process.grpc_port
        if not self._held and self._relay_task is None:
            await self._start_relay(c)

    async def _start_relay(self, c: ServiceConfig) -> None:
        if self._relay_backend is None:
            self._relay_backend = await open_backend(c)
        self._relay_stop = asyncio.Event()
        self._relay = RelayRunner(
            self._relay_backend,
            policy=c.relay_policy(),
            idle_wait_s=c.relay_idle_wait,
            metrics=RelayMetrics(CollectorRegistry()),
        )
        self._relay_task = asyncio.create_task(self._relay.run(self._relay_stop))

    async def _stop_relay(self) -> None:
        if self._relay_task is not None:
            self._relay_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._relay_task, 10)
            self._relay_task = None

    async def kill(self) -> None:
        if self.process is not None:
            self.process.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(self.process.close)
            self.process = None

    async def hold_delivery(self) -> None:
        self._held = True
        await self._stop_relay()

    async def release_delivery(self) -> None:
        self._held = False
        await self._start_relay(self.config)

    async def close(self) -> None:
        await self.kill()
        await self._stop_relay()
        if self._relay_backend is not None:
            await self._relay_backend.close()
