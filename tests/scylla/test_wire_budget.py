"""A commit's CQL requests, counted on the wire and by the node itself (issue 14).

The backend connects through a counting proxy (``toolkit/bench/cqlwire.py``),
which counts QUERY/EXECUTE/BATCH frames and, from the PREPARE traffic, which
of them are conditional. The node's own count is ``request_count`` of its
``system_views.clients`` rows for the driver's session (Cassandra 4+; read
through a second session so that reading it is not counted). Both must agree
with the backend's own counter and stay within the budget: at most 10
requests, 4 of them conditional, per fresh commit, and 1 per replay.
"""

from __future__ import annotations

from collections import Counter

import pytest

from backends.scylla import open_scylla_backend
from backends.scylla.session import CqlSession
from service.domain.ports import Backend
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, unique
from toolkit.bench.cqlwire import WireCounter

pytestmark = pytest.mark.scylla

COMMITS = 20
FRESH_BUDGET, CONDITIONAL_BUDGET, REPLAY_BUDGET = 10, 4, 1
SLACK = 2  # heartbeats (OPTIONS) the node also counts during a run


async def _node_count(admin: CqlSession, backend: Backend) -> int:
    """What the node counted on the backend's connections (its driver session id)."""
    session_id = str(store_of(backend).cql.session_id)
    rows = await admin.simple("SELECT client_options, request_count FROM system_views.clients")
    return sum(
        int(r["request_count"] or 0)
        for r in rows
        if dict(r["client_options"] or {}).get("SESSION_ID") == session_id
    )


async def test_a_fresh_commit_is_at_most_10_requests_4_conditional_and_a_replay_1(
    scylla: ScyllaHarness,
) -> None:
    async with WireCounter(scylla.host, scylla.port) as wire:
        backend = await open_scylla_backend(
            [scylla.host], port=wire.port, keyspace=scylla.keyspace, namespace=scylla.namespace
        )
        admin = await CqlSession.connect(
            [scylla.host], port=scylla.port, keyspace=scylla.keyspace, requests=Counter()
        )
        try:
            tenant = unique("t")
            await conversation(backend, tenant)
            c = committer(backend)
            await c.commit_send(send(tenant))  # first use of the day's outbox row
            sends = [send(tenant) for _ in range(COMMITS)]

            phases: dict[str, tuple[Counter[str], Counter[str], int]] = {}
            for phase in ("fresh", "replay"):
                before, counted, node = wire.snapshot(), Counter(backend.requests), 0
                node = await _node_count(admin, backend)
                for request in sends:
                    await c.commit_send(request)
                after = wire.snapshot()
                phases[phase] = (
                    after - before,
                    Counter(backend.requests) - counted,
                    await _node_count(admin, backend) - node,
                )
        finally:
            await admin.close()
            await backend.close()

    for phase, budget in (("fresh", FRESH_BUDGET), ("replay", REPLAY_BUDGET)):
        on_wire, by_backend, by_node = phases[phase]
        assert on_wire["compressed"] == 0
        assert on_wire["requests"] <= budget * COMMITS, (phase, on_wire)
        assert on_wire["requests"] == sum(by_backend.values()), (phase, on_wire, by_backend)
        assert on_wire["requests"] <= by_node <= on_wire["requests"] + SLACK, (phase, by_node)
    fresh_wire, fresh_backend, _ = phases["fresh"]
    assert fresh_wire["conditional"] <= CONDITIONAL_BUDGET * COMMITS, fresh_wire
    assert fresh_wire["conditional"] == fresh_backend["lwt"], (fresh_wire, fresh_backend)
    assert phases["replay"][0]["conditional"] == 0
