"""Pytest plugin: a real CQL server for the Scylla suites (listed in ``tests/conftest.py``).

Where the server comes from, in order:

1. ``MC_TEST_CQL_CONTACT=host:port`` (a ScyllaDB or Cassandra you run), as given;
2. a working Docker engine and the optional ``testcontainers`` package: a
   throwaway ScyllaDB container;
3. an Apache Cassandra 5.0 node started from ``deploy/cassandra/cassandra_node.py``
   (Maven Central jars, Java 17) on free loopback ports in a temp directory,
   stopped at the end of the session (by its pid). Same CQL and Paxos LWTs
   as ScyllaDB.

A server that cannot start fails the tests with its log tail; they are never
skipped.

Fixtures: ``cql_server`` / ``cql_contact`` (session: the server, and its
``(host, port)``), ``cql_keyspace`` (session: a fresh keyspace, migrated once),
``scylla_harness`` (per test: backends on that keyspace with the test's own
namespace for the recovery index and the outbox; tests use unique tenants),
``own_cql_node`` (per test: a node the test may stop or restart: the
session's own node when this plugin started it, else a private one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

import pytest

from backends.scylla import open_scylla_backend
from backends.scylla.migrate import migrate
from backends.scylla.session import CqlSession
from service.domain.delivery import DeliverySettings
from service.domain.ports import Backend, Clock, StoreSettings
from tests.conformance.harness import Harness, IdentityForm

T = TypeVar("T")
ENV_CONTACT = "MC_TEST_CQL_CONTACT"
START_TIMEOUT_S = 300.0
LAUNCHER = Path(__file__).resolve().parents[2] / "deploy" / "cassandra" / "cassandra_node.py"


class Node(Protocol):
    """What the tests use of deploy/cassandra/cassandra_node.py's CassandraNode."""

    host: str
    port: int
    pid: int | None

    def start(self, timeout: float = ...) -> None: ...
    def stop(self, grace: float = ...) -> None: ...
    def kill(self) -> None: ...
    def restart(self, timeout: float = ...) -> None: ...
    def is_running(self) -> bool: ...


@dataclass
class CqlServer:
    host: str
    port: int
    node: Node | None = None  # set when this plugin started the node itself


def _launcher() -> ModuleType:
    name = "mc_cassandra_node"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, LAUNCHER)
    if spec is None or spec.loader is None:
        pytest.fail(f"cannot load the Cassandra launcher at {LAUNCHER}", pytrace=False)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def start_node(data_dir: Path, extra_config: str = "") -> Any:
    """A started CassandraNode in ``data_dir`` (``extra_config``: cassandra.yaml lines
    to add); a failed start fails the test with its log."""
    launcher = _launcher()
    node = launcher.CassandraNode(data_dir, extra_config=extra_config)
    try:
        launcher.ensure_jars()
        node.start(START_TIMEOUT_S)
    except launcher.CassandraError as exc:
        node.kill()
        pytest.fail(f"the Cassandra test node did not start:\n{exc}", pytrace=False)
    return node


def _parse_contact(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        pytest.fail(f"{ENV_CONTACT} must be host:port", pytrace=False)
    return host, int(port)


def _docker_scylla() -> Any | None:
    """A started testcontainers ScyllaDB, or None when Docker is not usable."""
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
        module = importlib.import_module("testcontainers.scylla")
    except ImportError:
        return None
    container = module.ScyllaContainer()
    container.start()
    return container


@pytest.fixture(scope="session")
def cql_server() -> Iterator[CqlServer]:
    """A CQL server for the whole session (see the module docstring)."""
    given = os.environ.get(ENV_CONTACT)
    if given:
        host, port = _parse_contact(given)
        yield CqlServer(host, port)
        return
    container = _docker_scylla()
    if container is not None:
        try:
            yield CqlServer(
                container.get_container_host_ip(), int(container.get_exposed_port(9042))
            )
        finally:
            container.stop()
        return
    directory = Path(tempfile.mkdtemp(prefix="mc-cql-"))
    node = start_node(directory / "node")
    try:
        yield CqlServer(node.host, node.port, node)
    finally:
        node.kill()  # its data is deleted next: a graceful drain (~20 s loaded) buys nothing
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def cql_contact(cql_server: CqlServer) -> tuple[str, int]:
    return cql_server.host, cql_server.port


@pytest.fixture(scope="session")
def cql_keyspace(cql_contact: tuple[str, int]) -> Iterator[str]:
    """A keyspace of its own for this session, migrated once."""
    host, port = cql_contact
    keyspace = f"mct_{uuid.uuid4().hex[:16]}"
    _run_sync(lambda: migrate([host], port=port, keyspace=keyspace, replication="SimpleStrategy:1"))
    yield keyspace
    if os.environ.get(ENV_CONTACT):  # someone else's server: leave it as we found it
        with contextlib.suppress(Exception):
            _run_sync(lambda: _drop_keyspace(host, port, keyspace))


def _run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to the end on a loop of its own, in a helper thread: session
    fixtures may be set up from inside a running test loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


async def _drop_keyspace(host: str, port: int, keyspace: str) -> None:
    cql = await CqlSession.connect([host], port=port, keyspace=keyspace, requests=Counter())
    try:
        await cql.simple("DROP KEYSPACE IF EXISTS {ks}", timeout_s=60)
    finally:
        await cql.close()


class ScyllaHarness(Harness):
    """Backends on a shared, migrated keyspace; this test's own namespace."""

    name = "scylla"
    durable = True
    consistency = "LOCAL_QUORUM"

    def __init__(self, host: str, port: int, keyspace: str, namespace: str | None = None) -> None:
        super().__init__()
        self.host = host
        self.hosts = [host]
        self.port = port
        self.keyspace = keyspace
        self.namespace = namespace or f"ns-{uuid.uuid4().hex[:12]}"

    async def _open(
        self,
        *,
        clock: Clock | None,
        settings: StoreSettings | None,
        identity_form: IdentityForm,
        delivery: DeliverySettings | None = None,
    ) -> Backend:
        return await open_scylla_backend(
            self.hosts,
            port=self.port,
            keyspace=self.keyspace,
            settings=settings,
            clock=clock,
            identity_form=identity_form,
            namespace=self.namespace,
            consistency=self.consistency,
            serial_consistency="SERIAL",
            # A test clock is usually far from the wall clock: no skew guard then.
            max_clock_skew_ms=None if clock is not None else 3000,
            delivery=delivery,
        )


@pytest.fixture
def scylla_harness(cql_contact: tuple[str, int], cql_keyspace: str) -> ScyllaHarness:
    """A harness on the session keyspace. Synchronous, so the conformance
    suite's async ``harness`` fixture can fetch it; whoever opens backends
    closes them (``close_all``). Data stays: tenants and namespaces are unique."""
    host, port = cql_contact
    return ScyllaHarness(host, port, cql_keyspace)


@pytest.fixture
def own_cql_node(cql_server: CqlServer, tmp_path: Path) -> Iterator[CqlServer]:
    """A node this test may stop and restart (the session's own, when it has one)."""
    if cql_server.node is not None:
        yield cql_server
        if not cql_server.node.is_running():  # left stopped: bring it back for the others
            cql_server.node.start(START_TIMEOUT_S)
        return
    node = start_node(tmp_path / "node")
    try:
        yield CqlServer(node.host, node.port, node)
    finally:
        node.stop()
