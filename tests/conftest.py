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
    "tests.timeline",
]


SHARED_CQL_FIXTURES = frozenset({"cql_server", "cql_contact", "cql_keyspace", "scylla_harness"})
CLUSTER_FIXTURES = frozenset({"cql_cluster", "cql_cluster_keyspace", "scylla_cluster_harness"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``scripts/test.sh`` runs two workers with ``--dist
    loadgroup``), the cases on the session's CQL node run on one worker (group
    ``cql``) and the cases on the 3-node cluster on one worker (group
    ``cql-cluster``): each is started once, not once per worker (1-2 GiB and a
    minute of CPU each). The two groups are the largest, so xdist hands one to
    each worker first; a case that starts a CQL node of its own (marker
    ``own_cql``) and the rest, redis-servers included (cheap, one per worker), fill
    in around them. A module whose cases share a module-scoped fixture (a served
    backend, say) keeps them on one worker. The group is written into the node id
    as xdist itself does (``id@group``)."""
    if not config.getoption("loadgroup", default=False):  # absent when xdist is not loaded
        return
    for item in items:
        group = _group_of(item)
        if group:
            _rename(item, f"{item.nodeid}@{group}")


def _rename(item: pytest.Item, nodeid: str) -> None:
    """Give ``item`` the node id xdist's loadgroup scheduler reads its group from.
    pytest 9 keeps the id in ``_id`` (xdist 3.8 still writes ``_nodeid``, which pytest
    9 no longer reads, so its own ``xdist_group`` marks group nothing)."""
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        setattr(item, "_id", coerce_node_id(nodeid))  # noqa: B010 (a private slot)
    else:
        setattr(item, "_nodeid", nodeid)  # noqa: B010
    assert item.nodeid == nodeid, "pytest changed how a node keeps its id"


def _group_of(item: pytest.Item) -> str:
    """``cql-cluster``, ``cql``, the module (module-scoped fixtures) or none. A backend
    fetched with ``getfixturevalue`` is not among the fixture names: its parameter
    (``scylla``) or marks (``scylla``, ``cluster``) tell instead."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    param_ids = str(callspec.id) if callspec is not None else ""
    scylla = item.get_closest_marker("scylla") is not None or "scylla" in param_ids
    own = item.get_closest_marker("own_cql") is not None
    if names & CLUSTER_FIXTURES or (
        scylla and not own and item.get_closest_marker("cluster") is not None
    ):
        return "cql-cluster"
    if names & SHARED_CQL_FIXTURES or (scylla and not own):
        return "cql"
    if _uses_module_fixture(item):  # set up once, on one worker
        return item.nodeid.split("::", 1)[0]
    return ""


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
