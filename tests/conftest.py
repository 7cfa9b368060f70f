"""Test-wide plugins: the real servers (redis-server, a CQL node, clusters, toxiproxy) the
suites start."""

import gc
import os
from collections.abc import Iterator

import pytest

pytest_plugins = [
    "tests.servers.redis_server",
    "tests.servers.cql_server",
    "tests.servers.cql_cluster",
    "tests.servers.redis_topologies",
    "tests.servers.toxiproxy_server",
]


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """With ``MC_TEST_GC_EACH=1``, a full collection after every test, so a leaked
    connection's ResourceWarning is reported by the test that leaked it rather than
    by whichever test the collector happens to run in (a diagnostic: slower)."""
    yield
    if os.environ.get("MC_TEST_GC_EACH") == "1":
        gc.collect()
