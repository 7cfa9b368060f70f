"""One replica of the product over memory, Redis or Scylla, for the reading-rule tests.

``BACKENDS`` is the fixture parameter list; ``open_product(request, config)``
opens the backend the parameter names (Redis and Scylla through the
conformance harnesses), starts the real ``build_server`` on loopback and hands
back a client and a fresh tenant. With ``relay=True`` a backend whose relay is a
process of its own (Redis, Scylla) gets a ``RelayRunner`` beside the server, as
``message-committer relay`` would be; memory's relay runs inside the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from backends.memory import open_memory_backend
from service.bootstrap import build_server
from service.client import CommitClient
from service.config import ServiceConfig
from service.domain.ports import Backend
from service.relay_metrics import RelayMetrics
from service.relay_runner import RelayRunner
from tests.e2e.conftest import FAST_RETRY
from tests.support import unique

BACKENDS = [
    pytest.param("memory", marks=pytest.mark.memory),
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("scylla", marks=pytest.mark.scylla),
]


@dataclass
class Product:
    client: CommitClient
    tenant: str


@contextlib.asynccontextmanager
async def open_product(
    request: pytest.FixtureRequest, config: ServiceConfig, *, relay: bool = False
) -> AsyncIterator[Product]:
    harness = None
    if request.param == "memory":
        backend: Backend = open_memory_backend()
    else:
        harness = request.getfixturevalue(f"{request.param}_harness")
        backend = await harness.open()
    server = build_server(config, backend)
    stop = asyncio.Event()
    relay_task = None
    if relay and server.relay is None:
        runner = RelayRunner(
            backend,
            policy=config.relay_policy(),
            idle_wait_s=config.relay_idle_wait,
            metrics=RelayMetrics(),
        )
        relay_task = asyncio.create_task(runner.run(stop))
    await server.start()
    client = CommitClient.connect(f"127.0.0.1:{server.grpc_port}", retry=FAST_RETRY)
    try:
        yield Product(client, unique("t"))
    finally:
        stop.set()
        if relay_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(relay_task, 10)
        await client.close()
        await server.stop(grace_s=0.5)
        if harness is not None:
            await harness.close_all()
        else:
            await backend.close()
