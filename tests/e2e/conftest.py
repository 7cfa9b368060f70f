"""A real server for the end-to-end tests, started in-process on free loopback ports.

``start_server`` wires a replica through the real ``bootstrap.build_server``
around a memory backend whose store and outbox are wrapped by
``toolkit.campaign.faulty`` (so a test can make readiness, reserve or a read
fail on demand), starts it on 127.0.0.1:0 (gRPC) and 127.0.0.1:0 (HTTP), and
hands back a real client. Everything started is stopped at the end.
"""

from __future__ import annotations

import asyncio
import shutil
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from backends.memory import open_memory_backend
from service.bootstrap import build_server
from service.client import ClientTls, CommitClient, RetryPolicy
from service.config import ServiceConfig
from service.domain.faults import FaultPoints
from service.domain.ports import Backend
from service.server import CommitServer
from toolkit.campaign.faulty import CallFault, FaultyOutbox, FaultyStore

ROOT = Path(__file__).resolve().parents[2]
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, deadline_s=5.0)

BASE_CONFIG = ServiceConfig(
    backend="memory",
    grpc_address="127.0.0.1:0",
    http_address="127.0.0.1:0",
    readiness_interval=0.05,
    recovery_interval=3600.0,  # tests drive recovery themselves unless they ask
    shutdown_grace=2.0,
    sender_rate_per_s=0.0,
)


@dataclass
class Running:
    """One started replica and what a test may poke at."""

    server: CommitServer
    backend: Backend
    store: FaultyStore
    outbox: FaultyOutbox
    faults: FaultPoints
    client: CommitClient

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    def fail_readiness(self) -> None:
        """Every readiness call fails from now on, until ``heal``."""
        self.store.inject("readiness", CallFault.FAIL, times=1_000_000)

    def heal(self) -> None:
        self.store.faults.clear()
        self.outbox.faults.clear()


def faulty_memory_backend() -> tuple[Backend, FaultyStore, FaultyOutbox]:
    inner = open_memory_backend()
    store, outbox = FaultyStore(inner.store), FaultyOutbox(inner.outbox)
    backend = Backend(
        name="memory",
        store=store,
        membership=inner.membership,
        outbox=outbox,
        durable=False,
        delivery=inner.delivery,
    )
    return backend, store, outbox


StartServer = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start replicas with ``await start_server(**config_overrides)``; all stop at the end."""
    started: list[Running] = []

    async def start(tls: ClientTls | None = None, **overrides: Any) -> Running:
        config = replace(BASE_CONFIG, **overrides)
        backend, store, outbox = faulty_memory_backend()
        faults = FaultPoints()
        server = build_server(config, backend, faults=faults)
        await server.start()
        client = CommitClient.connect(
            f"127.0.0.1:{server.grpc_port}" if tls is None else f"localhost:{server.grpc_port}",
            tls=tls,
            retry=FAST_RETRY,
        )
        running = Running(server, backend, store, outbox, faults, client)
        started.append(running)
        return running

    yield start
    for running in reversed(started):
        await running.client.close()
        await running.server.stop(grace_s=0.5)


@pytest.fixture
async def running(start_server: StartServer) -> Running:
    return await start_server()


async def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET, in a thread (the server runs on this loop)."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Wait until ``check()`` is true (polling every 20 ms), or fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout_s}s")


def tool(name: str) -> str | None:
    """A command-line tool from .tools/ (scripts/install-tools.sh) or PATH."""
    for candidate in (
        ROOT / ".tools" / "bin" / name,
        ROOT / ".tools" / "node_modules" / ".bin" / name,
    ):
        if candidate.exists():
            return str(candidate)
    return shutil.which(name)


# Typed multicallables (the grpc_health and grpc_reflection stubs are untyped).


def health_check(
    channel: aio.Channel,
) -> aio.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]:
    return channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


def health_watch(
    channel: aio.Channel,
) -> aio.UnaryStreamMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]:
    return channel.unary_stream(
        "/grpc.health.v1.Health/Watch",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


def reflection_info(
    channel: aio.Channel,
) -> aio.StreamStreamMultiCallable[
    reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
]:
    return channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
