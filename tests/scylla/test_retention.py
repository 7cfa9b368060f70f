"""What is physically stored at COMMITTED: a compact intent and a history row, both TTLed."""

from __future__ import annotations

import pytest

from backends.scylla.codec import BODY_COLUMNS
from backends.scylla.schema import HISTORY_BUCKET
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import InProgress
from service.domain.ports import DAY_MS, StoreSettings
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, unique

pytestmark = pytest.mark.scylla


async def test_commit_compacts_the_intent_and_ttls_it_and_its_history_row(
    scylla: ScyllaHarness,
) -> None:
    settings = StoreSettings(idempotency_window_ms=DAY_MS, history_retention_ms=2 * DAY_MS)
    backend = await scylla.open(settings=settings)
    store = store_of(backend)
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    c.faults.arm(FaultPoint.AFTER_PUT_RECORD)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    loaded = await backend.store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress)
    stalled = loaded.intent  # a worker that stalls here and writes the record again later
    ack = await c.commit_send(req)

    intent_rows = await store.cql.simple(
        "SELECT state, identity, message_id, TTL(message_id) AS ttl, "
        + ", ".join(BODY_COLUMNS)
        + " FROM {ks}.commits WHERE tenant = %s AND sender = %s AND cmid = %s",
        (tenant, req.sender, req.cmid),
    )
    row = intent_rows[0]
    assert row["state"] == "committed" and row["message_id"] == ack.message_id
    assert row["identity"].startswith(b"QIMD")
    assert all(row[column] is None for column in BODY_COLUMNS)  # the body is dropped
    assert DAY_MS // 1000 <= row["ttl"] <= DAY_MS // 1000 + 60

    await store._history.put(stalled.record, stalled.created_at_ms, 0)  # lands after the commit
    history_rows = await store.cql.simple(
        "SELECT expires_at_ms, TTL(message_id) AS ttl FROM {ks}.history"
        " WHERE tenant = %s AND conversation = %s AND bucket = %s AND seq = %s",
        (tenant, "c1", ack.seq // HISTORY_BUCKET, ack.seq),
    )
    assert history_rows[0]["expires_at_ms"] is not None
    assert 2 * DAY_MS // 1000 <= history_rows[0]["ttl"] <= 2 * DAY_MS // 1000 + 60
