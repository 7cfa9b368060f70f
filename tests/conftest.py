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


CQL_FIXTURES = frozenset({"cql_server", "cql_cluster"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``scripts/test.sh`` runs two workers), every case that
    reaches a CQL server runs on one worker: the session's Cassandra node and
    3-node cluster are started once, not once per worker (each takes 1-2 GiB
    and a minute of CPU). The rest, redis-servers included (cheap, one per
    worker), is spread over both workers; a module whose cases share a module-scoped
    fixture (a served backend, say) keeps them on one worker."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        param_ids = str(callspec.id) if callspec is not None else ""
        on_cql = (
            bool(names & CQL_FIXTURES)
            or item.get_closest_marker("scylla") is not None
            or (item.get_closest_marker("cluster") is not None and "scylla" in param_ids)
        )
        if on_cql:
            item.add_marker(pytest.mark.xdist_group("cql"))
        elif _uses_module_fixture(item):  # set up once, on one worker
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {})
    return any(d.scope in ("module", "package") for chain in defs.values() for d in chain)


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """With ``MC_TEST_GC_EACH=1``, a full collection after every test, so a leaked
    connection's ResourceWarning is reported by the test that leaked it rather than
    by whichever test the collector happens to run in (a diagnostic: slower)."""
    yield
    if os.environ.get("MC_TEST_GC_EACH") == "1":
        gc.collect()
