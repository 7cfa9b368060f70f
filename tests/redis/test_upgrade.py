"""Release 1's Redis data, upgraded in place by ``message-committer migrate --backend redis``.

The keys come from ``tests/fixtures/release1_redis.json``: exactly what release 1
wrote (two commits, intents left RESERVED, RECORDED and OUTBOXED, membership at
version 3, inline recipient lists, one outbox stream). After the upgrade today's
code must replay the old ACKs, finish the old intents, list history and members,
and still read the old outbox entries.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from backends.redis import open_redis_backend
from backends.redis.keys import KeySpace
from service.domain.errors import StoreInvalid, StoreSchemaError
from service.domain.model import AuthenticatedSend, Direction, HistoryQuery, MessageContent
from service.domain.model import MessageType as T
from service.domain.ports import ManualClock
from tests.e2e.process import run_cli
from tests.servers.redis_server import RedisServer
from tests.support import committer, members
from toolkit.campaign.invariants import Ledger, check_invariants, check_recovered

pytestmark = pytest.mark.redis

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "release1_redis.json"


def _b(text: str) -> bytes:
    return base64.b64decode(text)


def load_release1(url: str) -> dict[str, Any]:
    """Write every key of the fixture into the server, as release 1 left them."""
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    with Redis.from_url(url) as raw:
        for entry in data["keys"]:
            key, kind, value = _b(entry["key"]), entry["type"], entry["value"]
            if kind == "hash":
                raw.hset(key, mapping={_b(k): _b(v) for k, v in value.items()})
            elif kind == "set":
                raw.sadd(key, *[_b(v) for v in value])
            elif kind == "zset":
                raw.zadd(key, {_b(m): score for m, score in value})
            elif kind == "string":
                raw.set(key, _b(value))
            elif kind == "stream":
                for position, fields in value:
                    raw.xadd(key, {_b(k): _b(v) for k, v in fields.items()}, id=position)
            if entry["pttl"] > 0:
                raw.pexpire(key, entry["pttl"])
    return data


def _request(cmid: str, body: str, sender: str = "alice") -> AuthenticatedSend:
    return AuthenticatedSend(
        "legacy", sender, "phone", "c1", cmid, MessageContent(T.TEXT, body.encode())
    )


async def test_release1_data_commits_recovers_and_lists_after_migrate(
    own_redis_server: RedisServer,
) -> None:
    url = own_redis_server.url
    data = load_release1(url)
    facts = data["facts"]
    with pytest.raises(StoreSchemaError, match="release 1's layout"):
        await open_redis_backend(url, prefix="r1")
    migrated = run_cli(["migrate", "--backend", "redis", "--prefix", "r1"], {"MC_REDIS_URL": url})
    assert migrated.returncode == 0, migrated.stderr
    assert "upgraded release 1 data (1 conversations)" in migrated.stdout
    again = run_cli(["migrate", "--backend", "redis", "--prefix", "r1"], {"MC_REDIS_URL": url})
    assert "already initialised" in again.stdout
    written_at = max(a["server_ts_ms"] for a in facts["acks"])
    clock = ManualClock(written_at + 60_000)  # as if a minute after release 1 wrote it
    backend = await open_redis_backend(url, prefix="r1", test_clock=clock)
    try:
        c = committer(backend, clock)
        done = [_request("done-1", "one"), _request("done-2", "two", "bob")]
        for request, ack in zip(done, facts["acks"], strict=True):
            replayed = await c.commit_send(request)
            assert (replayed.message_id, replayed.seq) == (ack["message_id"], ack["seq"])
        report = await c.recover_due(clock.now_ms(), 100)
        assert (report.scanned, report.committed, report.quarantined) == (3, 3, 0)
        stuck = [
            _request("at-reserved", "at-reserved"),
            _request("at-recorded", "at-recorded"),
            _request("at-outboxed", "three"),
        ]
        ledger = Ledger()
        ledger.conversation("legacy", "c1", "bob")
        for request in [*done, *stuck]:
            ledger.acked(request, await c.commit_send(request))
        assert sorted(a[0][1].seq for a in ledger.acks.values()) == [1, 2, 3, 4, 5]
        page = await c.history(HistoryQuery("legacy", "c1", "carol", Direction.FORWARD))
        assert [r.content.body for r in page.records] == [
            b"one", b"two", b"at-reserved", b"at-recorded", b"three"
        ]  # fmt: skip
        assert await members(backend, "legacy", "c1") == ["alice", "bob", "carol"]
        info = await backend.membership.membership_info("legacy", "c1")
        assert info is not None and (info.version, info.member_count) == (3, 3)
        with pytest.raises(StoreInvalid):  # versions before the upgrade were never kept
            await backend.membership.members_at("legacy", "c1", 2, "", 10)
        outbox = await backend.outbox.read("", 1000)
        legacy = [e for e in outbox.entries if e.publication.stream == "r1:outbox"]
        assert len(legacy) == 3 and all(e.recipients for e in legacy)
        assert await check_recovered(backend, clock.now_ms(), ledger) == []
        assert await check_invariants(backend, ledger) == []
        keys = KeySpace("r1", 128)
        with Redis.from_url(url) as raw:
            assert not raw.exists("r1:schema", "r1:recovery", "r1:{legacy:c1}:m")
            assert raw.hget(keys.meta, "schema") == b"2"
    finally:
        await backend.close()
