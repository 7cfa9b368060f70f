"""Pytest plugin: a real Redis for the suites (listed in ``tests/conftest.py``).

Where the Redis comes from, in order:

1. ``MC_TEST_REDIS_URL`` (e.g. ``redis://127.0.0.1:6379/0``), as given;
2. a working Docker engine and the optional ``testcontainers`` package: a
   throwaway ``redis:7`` container;
3. a ``redis-server`` this plugin starts on a free loopback port in a temp
   directory, with ``--appendonly yes --appendfsync always --save ''``.

A missing ``redis-server`` fails the tests loudly; they are never skipped.

Fixtures: ``redis_url`` (session), ``redis_harness`` (per test: a fresh
key prefix, initialised, every key of it deleted afterwards) and
``own_redis_server`` (per test: a private server the test may stop, restart
or kill). A server this plugin starts has its default prefix ``mc``
initialised, as an operator's ``migrate --backend redis`` would; the
service never initialises a Redis itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from backends.redis import open_link, open_redis_backend
from backends.redis.deployment import initialise
from backends.redis.keys import KeySpace
from backends.redis.link import parse_url
from service.domain.delivery import DeliverySettings
from service.domain.ports import Backend, Clock, StoreSettings
from tests.conformance.harness import Harness, IdentityForm
from toolkit.ports import free_port

ENV_URL = "MC_TEST_REDIS_URL"
DEFAULT_PREFIX = "mc"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
MAX_CLEANUP_ROUNDS = 10_000


class RedisServerMissing(RuntimeError):
    """No redis-server executable on PATH."""


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process on 127.0.0.1, its data in a temp directory."""

    def __init__(self, executable: str | None = None, extra_args: Sequence[str] = ()) -> None:
        found = executable or shutil.which("redis-server")
        if found is None:
            raise RedisServerMissing(
                f"redis-server is not installed: apt-get install -y redis-server (or set {ENV_URL})"
            )
        self.executable = found
        self.extra_args = list(extra_args)
        self.directory = Path(tempfile.mkdtemp(prefix="mc-redis-"))
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start on a free port (or the previous one, so URLs stay valid)."""
        if self.running:
            return
        for _ in range(5):
            port = self.port or free_port()
            if self._launch(port):
                self.port = port
                return
            if self.port:
                break  # the old port is taken: nothing else would keep the URL
        raise RuntimeError("redis-server did not start; see its log in the temp directory")

    def _launch(self, port: int) -> bool:
        args = [
            self.executable,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "yes",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
            *self.extra_args,
        ]
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            if _ping(port):
                return True
            time.sleep(0.05)
        self.kill()
        return False

    def stop(self) -> None:
        """SIGTERM: Redis finishes the AOF and exits."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: a crash; only what reached the AOF survives."""
        self._end(signal.SIGKILL)

    def restart(self) -> None:
        """Stop and start again on the same port, keeping the data."""
        self.stop()
        self.start()

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        """Kill the server and delete its data."""
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def _docker_redis() -> Any | None:
    """A started testcontainers Redis, or None when Docker is not usable."""
    if shutil.which("docker") is None:
        return None
    try:
        ok = subprocess.run(
            ["docker", "info"], capture_output=True, timeout=10, check=False
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return None
    if ok != 0:
        return None
    try:
        module = importlib.import_module("testcontainers.redis")
    except ImportError:
        return None
    container = module.RedisContainer("redis:7")
    container.start()
    return container


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis for the whole session (see the module docstring)."""
    given = os.environ.get(ENV_URL)
    if given:
        yield given
        return
    container = _docker_redis()
    if container is not None:
        try:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        finally:
            container.stop()
        return
    try:
        server = RedisServer()
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    initialise_now(server.url)
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A private redis-server for one test, which may stop, restart or kill it.
    Its default prefix ``mc`` is initialised, as ``migrate --backend redis`` would."""
    try:
        server = RedisServer()
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    initialise_now(server.url)
    try:
        yield server
    finally:
        server.close()


def initialise_now(url: str, prefix: str = DEFAULT_PREFIX) -> None:
    """``initialise_prefix`` from synchronous code, even with a loop running (a
    synchronous fixture fetched by an async one): in a thread of its own."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, initialise_prefix(url, prefix)).result(timeout=60)


async def initialise_prefix(url: str, prefix: str = "mc", shards: int = 8) -> None:
    """``message-committer migrate --backend redis`` for ``prefix`` (idempotent)."""
    link = open_link(url)
    try:
        await initialise(link, prefix, shards)
    finally:
        await link.close()


async def open_initialised(url: str, prefix: str = "mc", **options: Any) -> Backend:
    """A Redis backend on ``prefix``, initialised first if it never was."""
    await initialise_prefix(url, prefix)
    return await open_redis_backend(url, prefix=prefix, **options)


class RedisHarness(Harness):
    """Backends on one test's own key prefix of a shared Redis."""

    name = "redis"
    durable = True

    def __init__(self, url: str, prefix: str | None = None, shards: int = 8) -> None:
        super().__init__()
        self.url = url
        self.prefix = prefix or f"mct-{uuid.uuid4().hex[:12]}"
        self.shards = shards
        self._initialised = False

    @property
    def keys(self) -> KeySpace:
        """The key layout of this harness's deployment (its prefix and shards)."""
        return KeySpace(self.prefix, self.shards)

    async def initialise(self) -> None:
        """``migrate --backend redis`` for this prefix (once), as an operator would."""
        if not self._initialised:
            await initialise_prefix(self.url, self.prefix, self.shards)
            self._initialised = True

    async def _open(
        self,
        *,
        clock: Clock | None,
        settings: StoreSettings | None,
        identity_form: IdentityForm,
        delivery: DeliverySettings | None = None,
    ) -> Backend:
        await self.initialise()
        return await open_redis_backend(
            self.url,
            prefix=self.prefix,
            test_clock=clock,
            settings=settings,
            identity_form=identity_form,
            delivery=delivery,
        )

    def delete_keys(self) -> int:
        """Delete every key of this prefix (synchronously); returns how many."""
        deleted = 0
        with sync_client(self.url) as client:
            for key in itertools.islice(
                client.scan_iter(match=f"{self.prefix}:*", count=500), MAX_CLEANUP_ROUNDS * 500
            ):
                deleted += int(client.delete(key))
        return deleted


@contextlib.contextmanager
def sync_client(url: str) -> Iterator[Any]:
    """A synchronous client of any topology the backend accepts (tests only), closed
    on exit. Through Sentinel, the Sentinel's own connections to the Sentinels are
    closed too: closing the master's client leaves them open, and the collector
    then reports their sockets as unclosed in whichever test it runs in."""
    address = parse_url(url)
    untyped = cast(Callable[..., Any], ClusterNode)
    if address.mode == "cluster":
        nodes = [untyped(host, port) for host, port in address.hosts]
        with RedisCluster(startup_nodes=nodes, password=address.password, socket_timeout=5) as c:
            yield c
        return
    if address.mode == "sentinel":
        sentinel: Any = cast(Callable[..., Any], Sentinel)(list(address.hosts), socket_timeout=5)
        try:
            with sentinel.master_for(
                address.master, db=address.db, password=address.password
            ) as client:
                yield client
        finally:
            for each in sentinel.sentinels:
                each.close()
        return
    with Redis.from_url(url, socket_timeout=5) as client:
        yield client


@pytest.fixture
def redis_harness(redis_url: str) -> Iterator[RedisHarness]:
    """A harness on a fresh prefix. Synchronous, so the conformance suite's
    async ``harness`` fixture can fetch it; whoever opens backends closes them
    (``close_all``); the prefix's keys are deleted afterwards."""
    harness = RedisHarness(redis_url)
    yield harness
    with contextlib.suppress(redis.RedisError):  # the server may be gone already
        harness.delete_keys()
