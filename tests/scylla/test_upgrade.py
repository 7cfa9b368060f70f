"""Release 1's data after ``migrate`` to schema 2: it commits, recovers, replays and lists.

``tests/fixtures/release1_scylla.json`` holds every row of a keyspace exactly
as release 1 wrote it (two commits; intents left RESERVED, RECORDED and
OUTBOXED; membership at version 3, inline recipient lists). The test builds a
fresh keyspace at schema 1 (release 1's DDL), loads the rows with the
statements release 1 used (UPDATE for ``commits``, whose rows have no row
marker; INSERT elsewhere), migrates to schema 2 and drives today's code with a
clock set from the fixture's own timestamps (2026-12-01 ~07:00 UTC), so the
test does not depend on today's date.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.scylla import open_scylla_backend
from backends.scylla.migrate import migrate
from backends.scylla.schema import SCHEMA_VERSION
from backends.scylla.session import CqlSession
from service.domain.errors import StoreInvalid
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    FrozenDeliveryInput,
    InProgress,
    MessageContent,
    MessageType,
)
from service.domain.ports import Backend, ManualClock
from tests.support import committer, members
from toolkit.campaign.invariants import Ledger, check_invariants, read_history

pytestmark = pytest.mark.scylla

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "release1_scylla.json"
KEYS = {
    "commits": ("tenant", "sender", "cmid"),
    "conversations": ("tenant", "conversation", "kind", "name", "cmid"),
    "history": ("tenant", "conversation", "bucket", "seq"),
    "history_expiry": ("tenant", "conversation", "expires_at_ms", "seq"),
    "recovery_index": ("namespace", "bucket", "shard", "created_at_ms", "tenant", "sender", "cmid"),
    "recovery_buckets": ("namespace", "bucket"),
    "outbox": ("namespace", "day", "position"),
    "outbox_days": ("namespace", "day"),
}
BODIES = {"done-1": "one", "done-2": "two", "at-reserved": "at-reserved",
          "at-recorded": "at-recorded", "at-outboxed": "three"}  # fmt: skip
SENDERS = {"done-2": "bob"}


def _value(v: Any) -> Any:
    if isinstance(v, dict) and "blob" in v:
        return base64.b64decode(v["blob"])
    if isinstance(v, dict) and "uuid" in v:
        return uuid.UUID(v["uuid"])
    return v


async def _load(cql: CqlSession, tables: dict[str, list[dict[str, Any]]]) -> None:
    """Every row, written as release 1 wrote it (values only where not null)."""
    for table, rows in tables.items():
        if table == "schema_version":
            continue  # migrate(up_to=1) recorded it
        keys = KEYS[table]
        for row in rows:
            cells = {c: _value(v) for c, v in row.items() if c not in keys and v is not None}
            where = " AND ".join(f"{k} = %s" for k in keys)
            if table == "commits":  # release 1 wrote commit rows by UPDATE only
                sets = ", ".join(f"{c} = %s" for c in cells)
                cql_text = f"UPDATE {{ks}}.{table} SET {sets} WHERE {where}"
                await cql.simple(cql_text, (*cells.values(), *(_value(row[k]) for k in keys)))
            else:
                columns = [*keys, *cells]
                values = [_value(row[k]) for k in keys] + list(cells.values())
                marks = ", ".join("%s" for _ in columns)
                await cql.simple(
                    f"INSERT INTO {{ks}}.{table} ({', '.join(columns)}) VALUES ({marks})", values
                )


def _send(cmid: str) -> AuthenticatedSend:
    return AuthenticatedSend(
        tenant="legacy",
        sender=SENDERS.get(cmid, "alice"),
        device="phone",
        conversation="c1",
        cmid=cmid,
        content=MessageContent(MessageType.TEXT, BODIES[cmid].encode()),
    )


@pytest.fixture
async def release1(cql_contact: tuple[str, int]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A keyspace at schema 1 holding the fixture's rows, then migrated; dropped after."""
    host, port = cql_contact
    keyspace = f"mcu_{uuid.uuid4().hex[:16]}"
    data = json.loads(FIXTURE.read_text())
    assert await migrate([host], port=port, keyspace=keyspace, up_to=1) == 1
    cql = await CqlSession.connect([host], port=port, keyspace=keyspace, requests=Counter())
    try:
        await _load(cql, data["tables"])
        assert await migrate([host], port=port, keyspace=keyspace) == SCHEMA_VERSION
        assert await migrate([host], port=port, keyspace=keyspace) == SCHEMA_VERSION  # again
        yield keyspace, data
    finally:
        await cql.simple("DROP KEYSPACE IF EXISTS {ks}", timeout_s=60)
        await cql.close()


async def _open(cql_contact: tuple[str, int], keyspace: str, clock: ManualClock) -> Backend:
    host, port = cql_contact
    return await open_scylla_backend(
        [host], port=port, keyspace=keyspace, clock=clock, max_clock_skew_ms=None
    )


async def test_release1_data_commits_recovers_replays_and_lists(
    cql_contact: tuple[str, int], release1: tuple[str, dict[str, Any]]
) -> None:
    keyspace, data = release1
    acks = {a["cmid"]: CommittedMessage(**a) for a in data["facts"]["acks"]}
    clock = ManualClock(max(a.server_ts_ms for a in acks.values()) + 60_000)
    backend = await _open(cql_contact, keyspace, clock)
    try:
        c = committer(backend, clock)
        m = backend.membership
        for cmid, ack in acks.items():  # committed keys replay their ACKs
            assert await c.commit_send(_send(cmid)) == ack
        info = await m.membership_info("legacy", "c1")
        assert info is not None and (info.version, info.member_count) == (3, 3)
        assert await members(backend, "legacy", "c1") == ["alice", "bob", "carol"]
        with pytest.raises(StoreInvalid):  # release 1 kept no older version
            await m.members_at("legacy", "c1", 2, "", 10)
        dave = await m.admission("legacy", "c1", "dave")
        assert dave is not None and (dave.version, dave.member) == (3, False)

        stuck = {cmid: _send(cmid) for cmid in data["facts"]["stuck"]}
        loaded = await backend.store.load_commit(stuck["at-reserved"].key, "c1")
        assert isinstance(loaded, InProgress)
        assert loaded.intent.delivery == FrozenDeliveryInput(("alice", "bob", "carol"), 3)
        stats = await backend.store.recovery_stats()
        created = min(r["created_at_ms"] for r in data["tables"]["recovery_index"])
        assert stats.oldest_unfinished_ms == created and stats.quarantined == 0

        clock.advance(120_000)
        report = await c.recover_due(clock.now_ms() - 30_000, 100)
        assert (report.scanned, report.committed, report.failed) == (3, 3, 0)
        recovered = {cmid: await c.commit_send(req) for cmid, req in stuck.items()}
        assert sorted(a.seq for a in recovered.values()) == [3, 4, 5]
        assert (await backend.store.recovery_stats()).oldest_unfinished_ms is None

        history = await read_history(backend, "legacy", "c1", "bob")
        assert [(r.seq, r.content.body) for r in history] == [
            (1, b"one"), (2, b"two"), (3, b"at-reserved"), (4, b"at-recorded"), (5, b"three"),
        ]  # fmt: skip
        page = await backend.outbox.read("", 100)
        old = {str(r["position"]["uuid"]) for r in data["tables"]["outbox"]}
        by_position = {e.publication.position: e for e in page.entries}
        assert old <= set(by_position)  # release 1's rows still read
        assert {by_position[p].recipients for p in old} == {("alice", "bob", "carol")}
        new = [e for e in page.entries if e.publication.position not in old]
        assert sorted(e.seq for e in new) == [3, 4]  # the OUTBOXED one was published already
        assert {(e.recipients, e.membership_version) for e in new} == {
            (("alice", "bob", "carol"), 3)
        }

        fresh = AuthenticatedSend("legacy", "carol", "web", "c1", "after-upgrade",
                                  MessageContent(MessageType.TEXT, b"hi"))  # fmt: skip
        ack = await c.commit_send(fresh)
        assert ack.seq == 6
        added = await m.add_members("legacy", "c1", ["erin"])
        assert (added.version, added.member_count) == (4, 4)
        assert await members(backend, "legacy", "c1", 3) == ["alice", "bob", "carol"]
        assert await members(backend, "legacy", "c1") == ["alice", "bob", "carol", "erin"]

        ledger = Ledger()
        ledger.conversation("legacy", "c1", "bob")
        for cmid, ack_ in {**acks, **recovered}.items():
            ledger.acked(_send(cmid), ack_)
        ledger.acked(fresh, ack)
        assert await check_invariants(backend, ledger) == []
    finally:
        await backend.close()
