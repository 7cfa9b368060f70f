"""The server and backend under test: started here, or targeted.

Without ``--target`` the bench opens the backend with the service's own
composition root (``service.bootstrap.open_backend`` + ``build_server``) and
runs the real ``CommitServer`` in this process, on 127.0.0.1 port 0. Its
backend is then also what the in-process floors drive, and its
``Backend.requests`` counter is read directly. The bench server differs from
``serve`` defaults in three settings, all for measurement hygiene: the
readiness probe and recovery loop run hourly (their backend calls would
otherwise land in the cost figures), and the per-sender quota is set far
above what any workload sends (its code still runs on every send).

Backends without an address given start throwaway servers, killed at the
end: a ``redis-server`` (``tests/servers/redis_server.py``'s RedisServer) and
a Cassandra node (``deploy/cassandra/cassandra_node.py``) whose keyspace is
created with the Scylla backend's migration. Those helpers live in the
development checkout, not in the installed package; elsewhere, pass an
address.

With ``--target HOST:PORT`` the bench only drives that server; the cost
figures then come from scraping ``--metrics-url`` before and after each
workload, and the storage floor needs the backend's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from service.bootstrap import build_server, open_backend, redis_wait_replicas, tune_gc
from service.config import ServiceConfig, StartupError
from service.domain.errors import StoreError
from service.domain.ports import Backend
from service.server import CommitServer
from toolkit.bench.cqlwire import read_counts
from toolkit.bench.driver import BenchError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
CASSANDRA_LAUNCHER = REPO / "deploy" / "cassandra" / "cassandra_node.py"
HOUR_S = 3600.0
UNLIMITED_RATE = 1_000_000.0
SCRAPE_TIMEOUT_S = 5.0
MAX_CLEANUP_ROUNDS = 100_000
WIRE_START_S = 30.0
_REQUESTS_LINE = re.compile(
    r'^message_committer_backend_requests_total\{kind="([^"]+)"\}\s+([0-9.eE+-]+)\s*$'
)


@dataclasses.dataclass(frozen=True, slots=True)
class BackendAddress:
    """Where a backend lives (never printed: a URL may hold a password)."""

    redis_url: str = ""
    scylla_contact_points: tuple[str, ...] = ()
    scylla_port: int = 9042
    scylla_keyspace: str = ""
    cql_wire: bool = False
    """Put a counting proxy (``toolkit/bench/cqlwire.py``, a process of its own) in
    front of the CQL node: CQL requests per op, counted on the wire."""


DRAIN_LIMIT_S = 600.0
"""Longest wait for the in-process relay to deliver earlier phases' commits."""
DRAIN_POLL_S = 0.05


@dataclasses.dataclass
class Target:
    """One server under test."""

    backend: str
    address: str
    description: str
    server: CommitServer | None = None
    floor_backend: Backend | None = None
    """The backend the in-process floors drive (the server's own when in-process)."""
    metrics_url: str = ""
    redis_url: str = ""
    own_floor_backend: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)
    wire_control: int = 0
    """The control port of the CQL wire counter in front of the backend, if any."""
    relay_config: ServiceConfig | None = None
    """The settings a relay process beside the server takes (a shared backend the
    bench started the server for); None: the relay runs inside, or is not ours."""

    @property
    def relay(self) -> str:
        """Where the relay runs while the sustained phase commits."""
        if self.server is not None and self.server.relay is not None:
            return "inside serve"
        if self.relay_config is not None:
            return "a relay process beside the server"
        return "not started by the bench"

    async def requests(self) -> Counter[str] | None:
        """The backend request counter now (plus ``wire``/``wire_lwt``, the requests
        and conditional ones the wire counter saw), or None when it cannot be read."""
        if self.server is not None:
            counts = Counter(self.server.backend.requests)
            if self.wire_control:
                wire = await read_counts(self.wire_control)
                counts["wire"], counts["wire_lwt"] = wire["requests"], wire["conditional"]
            return counts
        if not self.metrics_url:
            return None
        return await asyncio.to_thread(scrape_requests, self.metrics_url)

    async def settled(self, quiet_s: float = 0.1, limit_s: float = 10.0) -> None:
        """Wait until the in-process server's backend has sent nothing for ``quiet_s``
        (at most ``limit_s``): a phase's closing counts then include the commits still
        finishing when its clients stopped, on every counter alike (the wire's too)."""
        if self.server is None:
            return
        deadline = time.monotonic() + limit_s
        last = Counter(self.server.backend.requests)
        while time.monotonic() < deadline:
            await asyncio.sleep(quiet_s)
            now = Counter(self.server.backend.requests)
            if now == last:
                return
            last = now

    async def relay_drained(self, limit_s: float = DRAIN_LIMIT_S) -> float | None:
        """Wait until the relay inside the server has delivered everything committed so
        far (the memory outbox keeps only what is undelivered), polling; the seconds
        waited, 0.0 without an in-process relay, None when ``limit_s`` passed first.

        A phase must not be billed the relay work of the phases before it: the
        in-process floors alone commit some 150,000 messages in a few seconds, and
        their delivery landed on the next round's gRPC floor (issue 27)."""
        if self.server is None or self.server.relay is None:
            return 0.0
        outbox, start = self.server.backend.outbox, time.monotonic()
        while (await outbox.read("", 1)).entries:
            if time.monotonic() - start > limit_s:
                return None
            await asyncio.sleep(DRAIN_POLL_S)
        return time.monotonic() - start

    async def close(self) -> None:
        if self.server is not None:
            await self.server.stop(grace_s=1.0)  # closes the backend too
            self.server = None
        elif self.own_floor_backend and self.floor_backend is not None:
            await self.floor_backend.close()
        self.floor_backend = None


def scrape_requests(url: str) -> Counter[str]:
    """``message_committer_backend_requests_total`` by kind from a /metrics page."""
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        text = response.read().decode("utf-8", "replace")
    found: Counter[str] = Counter()
    for line in text.splitlines():
        match = _REQUESTS_LINE.match(line)
        if match:
            found[match.group(1)] = int(float(match.group(2)))
    return found


def _load_file_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


async def _initialise_redis(url: str, prefix: str) -> None:
    """What ``message-committer migrate --backend redis`` does for the bench's prefix."""
    from backends.redis import open_link
    from backends.redis.deployment import initialise

    link = open_link(url)
    try:
        await initialise(link, prefix)
    except StoreError as exc:
        raise BenchError(f"cannot initialise the bench's redis prefix: {exc}") from None
    finally:
        await link.close()


def _redis_server_module() -> ModuleType:
    """tests/servers/redis_server.py of the checkout, wherever the bench runs from."""
    if (REPO / "tests" / "servers" / "redis_server.py").is_file() and str(REPO) not in sys.path:
        sys.path.append(str(REPO))  # its imports name the repository's packages
    return importlib.import_module("tests.servers.redis_server")


class Environment:
    """Owns the throwaway servers of one bench run; ``close`` kills them all."""

    def __init__(
        self, given: BackendAddress, run_tag: str, redis_wait_replicas: int | None = None
    ) -> None:
        self._given = given
        self._tag = run_tag
        self._wait_replicas = redis_wait_replicas
        self._redis: Any = None
        self._cassandra: Any = None
        self._keyspace = ""
        self._used_given_redis = False
        self._wire: subprocess.Popen[str] | None = None
        self.wire_control = 0

    # --- backend addresses -------------------------------------------------

    @property
    def redis_prefix(self) -> str:
        return f"mcbench-{self._tag}"

    def redis_url(self) -> str:
        if self._given.redis_url:
            self._used_given_redis = True
            return self._given.redis_url
        if self._redis is None:
            try:
                module = _redis_server_module()
            except ImportError as exc:
                raise BenchError(
                    "no Redis given (--redis-url / MC_REDIS_URL) and the development "
                    "checkout's tests/servers/redis_server.py is not importable"
                ) from exc
            server = module.RedisServer()
            server.start()
            self._redis = server
        return str(self._redis.url)

    async def scylla(self) -> BackendAddress:
        where = await self._scylla()
        if not self._given.cql_wire:
            return where
        if self._wire is None:
            self._wire, port, self.wire_control = await _start_wire(
                where.scylla_contact_points[0], where.scylla_port
            )
            self._wire_port = port
        return dataclasses.replace(
            where, scylla_contact_points=("127.0.0.1",), scylla_port=self._wire_port
        )

    async def _scylla(self) -> BackendAddress:
        g = self._given
        if g.scylla_contact_points:
            return BackendAddress(
                scylla_contact_points=g.scylla_contact_points,
                scylla_port=g.scylla_port,
                scylla_keyspace=g.scylla_keyspace or "message_committer",
            )
        if self._cassandra is None:
            if not CASSANDRA_LAUNCHER.is_file():
                raise BenchError(
                    "no CQL server given (--scylla-contact-points) and the development "
                    "checkout's deploy/cassandra/cassandra_node.py is missing"
                )
            module = _load_file_module("mc_bench_cassandra_node", CASSANDRA_LAUNCHER)
            node = module.CassandraNode()
            self._cassandra = node
            await asyncio.to_thread(node.start)
            self._keyspace = f"mc_bench_{self._tag}"
            await _migrate(node.host, node.port, self._keyspace)
        node = self._cassandra
        return BackendAddress(
            scylla_contact_points=(str(node.host),),
            scylla_port=int(node.port),
            scylla_keyspace=self._keyspace,
        )

    async def config(self, backend: str) -> ServiceConfig:
        """The bench server's configuration for ``backend``."""
        config = ServiceConfig(
            backend=backend,
            grpc_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            redis_prefix=self.redis_prefix,
            readiness_interval=HOUR_S,
            recovery_interval=HOUR_S,
            sender_rate_per_s=UNLIMITED_RATE,
        )
        if backend == "redis":
            config = dataclasses.replace(
                config, redis_url=self.redis_url(), redis_wait_replicas=self._wait_replicas
            )
            await _initialise_redis(config.redis_url, config.redis_prefix)
        elif backend == "scylla":
            where = await self.scylla()
            config = dataclasses.replace(
                config,
                scylla_contact_points=where.scylla_contact_points,
                scylla_port=where.scylla_port,
                scylla_keyspace=where.scylla_keyspace,
            )
        return config

    # --- targets -------------------------------------------------------------

    async def start(self, backend: str) -> Target:
        """Run the real server in this process on ``backend``."""
        config = await self.config(backend)
        try:
            opened = await open_backend(config)
        except StartupError as exc:
            raise BenchError(f"cannot open the {backend} backend: {exc}") from None
        server = build_server(config, opened)
        try:
            await server.start()
        except BaseException:
            await opened.close()
            raise
        tune_gc()  # as `serve` does once it is up
        address = f"127.0.0.1:{server.grpc_port}"
        notes = []
        if backend == "redis" and self._redis is not None:
            notes.append("throwaway redis-server: appendonly yes, appendfsync always")
        if backend == "redis":
            waits = redis_wait_replicas(config)
            notes.append(f"every ACK waits for {waits} replica(s) (MC_REDIS_WAIT_REPLICAS)")
        if backend == "scylla" and self._given.scylla_contact_points:
            notes.append(
                "given keyspace: the bench's messages stay there (tenant bench-*) and reach"
                " its outbox; use a keyspace of its own"
            )
        if backend == "scylla" and self._cassandra is not None:
            notes.append(
                "throwaway Cassandra node (deploy/cassandra): 1 node, RF 1, commitlog periodic"
            )
        return Target(
            notes=notes,
            backend=backend,
            address=address,
            description=f"in-process CommitServer on {address}",
            server=server,
            floor_backend=opened,
            metrics_url=f"http://127.0.0.1:{server.http_port}/metrics",
            redis_url=config.redis_url,
            wire_control=self.wire_control if backend == "scylla" else 0,
            relay_config=None if server.relay is not None else config,
        )

    async def attach(self, backend: str, address: str, metrics_url: str) -> Target:
        """Drive a server someone else runs; open the backend for the floors if we can."""
        target = Target(
            backend=backend,
            address=address,
            description=f"external server at {address}",
            metrics_url=metrics_url,
        )
        g = self._given
        reachable = backend == "memory" or g.redis_url or g.scylla_contact_points
        if reachable:
            config = await self.config(backend)
            try:
                target.floor_backend = await open_backend(config)
            except StartupError as exc:
                raise BenchError(f"cannot open the {backend} backend: {exc}") from None
            target.own_floor_backend = True
            target.redis_url = config.redis_url
        return target

    def close(self) -> None:
        """Delete this run's keys from a given Redis; kill every server started here."""
        if self._given.redis_url and self._used_given_redis:
            self._used_given_redis = False
            with contextlib.suppress(Exception):  # best effort; never prints the address
                _delete_prefix(self._given.redis_url, self.redis_prefix)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()
            self._redis = None
        if self._wire is not None:
            wire, self._wire = self._wire, None
            wire.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                wire.wait(timeout=5)
        if self._cassandra is not None:
            node, self._cassandra = self._cassandra, None
            with contextlib.suppress(Exception):
                node.stop(grace=20)
            with contextlib.suppress(Exception):
                node.kill()
            if not node.is_running():
                shutil.rmtree(node.data_dir, ignore_errors=True)


async def _start_wire(host: str, port: int) -> tuple[subprocess.Popen[str], int, int]:
    """The CQL wire counter as a process of its own (its CPU is not the server's):
    (process, listening port, control port)."""
    process = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "toolkit.bench.cqlwire", "--target", f"{host}:{port}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), WIRE_START_S)
    words = line.split()
    if len(words) != 4 or words[0] != "listen":
        process.kill()
        raise BenchError("the CQL wire counter did not start")
    return process, int(words[1]), int(words[3])


def _delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix:`` (bounded); returns how many."""
    from redis import Redis

    deleted = 0
    with Redis.from_url(url, socket_timeout=5) as client:
        cursor = 0
        for _ in range(MAX_CLEANUP_ROUNDS):
            cursor, found = client.scan(cursor, match=f"{prefix}:*", count=1000)
            if found:
                deleted += int(client.delete(*found))
            if cursor == 0:
                break
    return deleted


async def _migrate(host: str, port: int, keyspace: str) -> None:
    """Create ``keyspace`` with the Scylla backend's own migration."""
    from backends.scylla.migrate import migrate

    await migrate([host], port=port, keyspace=keyspace)


def run_tag() -> str:
    """A short random tag that names this run's tenants, prefixes and keyspace."""
    return uuid.uuid4().hex[:8]
