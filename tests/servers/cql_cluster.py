"""Pytest plugin: a real three-node CQL cluster (listed in ``tests/conftest.py``).

Where the cluster comes from, in order:

1. ``MC_TEST_CQL_CLUSTER=host1,host2,host3:port`` (a cluster you run, e.g. with
   ``deploy/cassandra/cassandra_cluster.py start --nodes 3``), as given;
2. three Apache Cassandra 5.0 nodes started by ``deploy/cassandra/cassandra_cluster.py``
   on 127.0.0.11-13 (one shared free port) in a temp directory, stopped at the end of
   the session. About 35 s to start and 1.1 GiB of RAM per node on a 2-core box.

(No Docker path yet: a multi-container ScyllaDB cluster needs a network of its own.)
A cluster that cannot start fails the tests with its log tail; they are never skipped.

Fixtures: ``cql_cluster`` (session: hosts, port, the launcher when started here),
``cql_cluster_keyspace`` (session: a fresh keyspace with replication factor 3,
migrated once), ``scylla_cluster_harness`` (per test: backends on it at QUORUM with
SERIAL conditional writes). ``start_cluster`` gives a test a cluster of its own
(``tests/scylla/test_cross_dc.py`` starts a two-DC one).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from backends.scylla.migrate import migrate
from tests.servers.cql_server import ScyllaHarness, _drop_keyspace, _run_sync

ENV_CLUSTER = "MC_TEST_CQL_CLUSTER"
START_TIMEOUT_S = 300.0
LAUNCHER = Path(__file__).resolve().parents[2] / "deploy" / "cassandra" / "cassandra_cluster.py"


@dataclass
class ClusterServer:
    hosts: list[str]
    port: int
    cluster: Any | None = None  # the CassandraCluster, when this plugin started it
    replication: str = "NetworkTopologyStrategy:dc1=3"


def launcher() -> ModuleType:
    """deploy/cassandra/cassandra_cluster.py, loaded once."""
    name = "mc_cassandra_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, LAUNCHER)
    if spec is None or spec.loader is None:
        pytest.fail(f"cannot load the cluster launcher at {LAUNCHER}", pytrace=False)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def start_cluster(data_dir: Path, nodes: int = 3, dcs: int = 1, **kwargs: Any) -> ClusterServer:
    """A started cluster in ``data_dir``; a failed start fails the test with the log tail."""
    module = launcher()
    cluster = module.CassandraCluster(data_dir, nodes, dcs=dcs, **kwargs)
    try:
        cluster.start(START_TIMEOUT_S)
    except module.CassandraError as exc:
        cluster.kill()
        pytest.fail(f"the Cassandra test cluster did not start:\n{exc}", pytrace=False)
    return ClusterServer(cluster.contact_points, cluster.port, cluster, cluster.replication())


def _parse(value: str) -> tuple[list[str], int]:
    hosts, sep, port = value.rpartition(":")
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not sep or not names or not port.isdigit():
        pytest.fail(f"{ENV_CLUSTER} must be host1,host2,host3:port", pytrace=False)
    return names, int(port)


@pytest.fixture(scope="session")
def cql_cluster() -> Iterator[ClusterServer]:
    """A three-node cluster for the whole session (see the module docstring)."""
    given = os.environ.get(ENV_CLUSTER)
    if given:
        hosts, port = _parse(given)
        yield ClusterServer(hosts, port)
        return
    directory = Path(tempfile.mkdtemp(prefix="mc-cql-cluster-"))
    server = start_cluster(directory)
    try:
        yield server
    finally:
        assert server.cluster is not None
        server.cluster.kill()  # its data is deleted next: no drain of three nodes
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def cql_cluster_keyspace(cql_cluster: ClusterServer) -> Iterator[str]:
    """A keyspace of its own with replication factor 3, migrated once."""
    keyspace = f"mctc_{uuid.uuid4().hex[:16]}"
    hosts, port = cql_cluster.hosts, cql_cluster.port
    _run_sync(
        lambda: migrate(hosts, port=port, keyspace=keyspace, replication=cql_cluster.replication)
    )
    yield keyspace
    if os.environ.get(ENV_CLUSTER):  # someone else's cluster: leave it as we found it
        with contextlib.suppress(Exception):
            _run_sync(lambda: _drop_keyspace(hosts[0], port, keyspace))


class ScyllaClusterHarness(ScyllaHarness):
    """Backends on the cluster's RF 3 keyspace at QUORUM / SERIAL; this test's namespace."""

    name = "scylla_cluster"
    consistency = "QUORUM"

    def __init__(self, hosts: list[str], port: int, keyspace: str) -> None:
        super().__init__(hosts[0], port, keyspace)
        self.hosts = hosts


@pytest.fixture
def scylla_cluster_harness(
    cql_cluster: ClusterServer, cql_cluster_keyspace: str
) -> ScyllaClusterHarness:
    """A harness on the session's cluster keyspace (closed by whoever opens backends)."""
    return ScyllaClusterHarness(cql_cluster.hosts, cql_cluster.port, cql_cluster_keyspace)
