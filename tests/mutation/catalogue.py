"""Every hand-made mutant, by id, and the test subset each kind is run against.

Lua scripts (``lua_mutants``), CQL conditions and re-read decisions of the
Scylla backend (``cql_mutants``) and the handful of domain/memory mutants CI
applies (``python_mutants``). Each must be killed by its kind's selection;
``python -m tests.mutation.run`` applies them one by one and
``docs/mutation.md`` holds the killed-by table. A mutant whose text is no
longer in its module is reported as stale, never as killed.
"""

from __future__ import annotations

from tests.mutation.cql_mutants import CQL_MUTANTS
from tests.mutation.hook import Kind, Mutant
from tests.mutation.lua_mutants import LUA_MUTANTS
from tests.mutation.python_mutants import PYTHON_MUTANTS

# Standalone servers only: the ``cluster`` cases (Sentinel, a Redis Cluster, a 3-node
# CQL cluster) run the same scripts and statements on topologies that take minutes
# to start, and the ``slow`` ones (replication, restarts, a node of their own) test
# the topology, not a script's decision.
SELECTIONS: dict[Kind, tuple[str, ...]] = {
    "lua": ("tests/conformance", "tests/redis", "-m", "redis and not cluster and not slow"),
    "cql": ("tests/conformance", "tests/scylla", "-m", "scylla and not cluster and not slow"),
    "python": (
        "tests/unit",
        "tests/conformance",
        "tests/campaign/test_fault_campaign.py",
        "-m",
        "not redis and not scylla and not cluster",
    ),
}
"""What each kind of mutant is run against (with ``-x``: the first failure kills)."""

ALL: tuple[Mutant, ...] = (*LUA_MUTANTS, *CQL_MUTANTS, *PYTHON_MUTANTS)
BY_ID: dict[str, Mutant] = {m.id: m for m in ALL}
if len(BY_ID) != len(ALL):
    raise RuntimeError("mutant ids must be unique")
