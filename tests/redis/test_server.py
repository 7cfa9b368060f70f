"""Redis as a server: reconnects, restarts, crashes, races and secret hygiene."""

from __future__ import annotations

import asyncio
import traceback

import pytest
from redis.asyncio import Redis

from backends.redis import SCRIPTS, open_redis_backend
from backends.redis.link import CALL
from service.domain.errors import (
    Recoverable,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from service.domain.model import AuthenticatedSend, CommittedMessage, HistoryQuery
from service.domain.ports import Backend
from tests.redis.conftest import snapshot
from tests.servers.redis_server import RedisHarness, RedisServer, open_initialised
from tests.support import committer, conversation, send, text, unique
from toolkit.campaign.invariants import Ledger, check_invariants, read_history

pytestmark = pytest.mark.redis

SECRET = "s3cr3t-pa55word"


async def test_reconnects_after_its_connections_are_killed(
    redis_h: RedisHarness, raw: Redis
) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    first = await c.commit_send(send(tenant))
    killed = await raw.client_kill_filter(_type="normal", skipme=True)
    assert int(killed) >= 1
    second = await c.commit_send(send(tenant))
    assert second.seq == first.seq + 1
    await backend.store.readiness()


async def test_reopen_after_close_sees_the_same_data(redis_h: RedisHarness) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    req = send(tenant)
    ack = await committer(backend).commit_send(req)
    await backend.close()
    await backend.close()  # idempotent
    again = await redis_h.open()
    assert await committer(again).commit_send(req) == ack


async def test_scripts_are_reloaded_after_a_script_flush(redis_h: RedisHarness, raw: Redis) -> None:
    backend = await redis_h.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    await raw.script_flush()
    before = backend.requests[CALL]
    await committer(backend).commit_send(send(tenant))  # NOSCRIPT, reload, call again
    assert backend.requests[CALL] > before + 5
    await raw.script_flush()
    await backend.store.readiness()  # reloads what is missing
    assert all(await raw.script_exists(*_shas()))


def _shas() -> list[str]:
    return [s.sha for s in SCRIPTS]


async def _commit_many(backend: Backend, tenant: str, n: int) -> list[CommittedMessage]:
    c = committer(backend)
    return [await c.commit_send(_numbered(tenant, i)) for i in range(n)]


def _numbered(tenant: str, i: int) -> AuthenticatedSend:
    return send(tenant, cmid=f"m-{i}", content=text(f"b{i}"))


@pytest.mark.parametrize("how", ["restart", "kill"])
async def test_a_restart_with_aof_always_loses_no_committed_message(
    own_redis_server: RedisServer, how: str
) -> None:
    backend = await open_initialised(own_redis_server.url, prefix="durable")
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        acks = await _commit_many(backend, tenant, 40)
    finally:
        await backend.close()
    if how == "kill":
        own_redis_server.kill()  # SIGKILL: only what reached the AOF survives
        own_redis_server.start()
    else:
        own_redis_server.restart()
    backend = await open_initialised(own_redis_server.url, prefix="durable")
    try:
        c = committer(backend)
        for i, ack in enumerate(acks):
            assert await c.commit_send(_numbered(tenant, i)) == ack
        history = await read_history(backend, tenant, "c1", "bob")
        assert [r.message_id for r in history] == [a.message_id for a in acks]
        assert len((await backend.outbox.read("", 1000)).entries) == len(acks)
        assert (await c.commit_send(send(tenant))).seq == len(acks) + 1
    finally:
        await backend.close()


async def test_a_dead_server_gives_recoverable_and_the_backend_recovers(
    own_redis_server: RedisServer,
) -> None:
    backend = await open_initialised(own_redis_server.url, prefix="p", connect_timeout_s=0.3)
    try:
        tenant = unique("t")
        await conversation(backend, tenant)
        c = committer(backend)
        await c.commit_send(send(tenant))
        own_redis_server.stop()
        with pytest.raises(StoreUnavailable) as caught:
            await backend.store.readiness()
        _assert_clean(caught.value, own_redis_server)
        req = send(tenant)
        with pytest.raises(Recoverable):
            await c.resume_existing(req)
        with pytest.raises(StoreOutcomeUnknown) as unknown:
            await backend.membership.create_conversation(tenant, "c2", ["alice"])
        _assert_clean(unknown.value, own_redis_server)
        own_redis_server.start()  # same port, same data
        await backend.store.readiness()
        assert (await c.commit_send(req)).seq == 2
    finally:
        await backend.close()


async def test_two_instances_racing_on_one_conversation_never_share_a_seq(
    redis_h: RedisHarness,
) -> None:
    one, two = await redis_h.open(), await redis_h.open()
    tenant = unique("t")
    await conversation(one, tenant)
    c1, c2 = committer(one), committer(two)
    requests = [send(tenant, content=text(f"r{i}")) for i in range(120)]
    acks = await asyncio.gather(
        *(
            (c1 if i % 2 else c2).commit_send(req)
            for i, req in enumerate(requests + requests[:40])  # 40 duplicates across instances
        )
    )
    by_key: dict[str, set[CommittedMessage]] = {}
    for req, ack in zip(requests + requests[:40], acks, strict=True):
        by_key.setdefault(req.cmid, set()).add(ack)
    assert all(len(v) == 1 for v in by_key.values())
    assert sorted(a.seq for a in {a for v in by_key.values() for a in v}) == list(range(1, 121))
    ledger = Ledger()
    ledger.conversation(tenant, "c1", "bob")
    for req, ack in zip(requests + requests[:40], acks, strict=True):
        ledger.acked(req, ack)
    assert await check_invariants(one, ledger) == []


def _chain(exc: BaseException) -> str:
    """The messages of ``exc`` and of every exception a traceback would show."""
    parts: list[str] = []
    seen: BaseException | None = exc
    for _ in range(20):
        if seen is None:
            break
        parts.extend(traceback.format_exception_only(seen))
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return "".join(parts)


def _assert_clean(exc: BaseException, server: RedisServer | None = None) -> None:
    rendered = _chain(exc)
    for secret in (SECRET, "redis://", "127.0.0.1", "mc:", "{", "EVALSHA", "NOSCRIPT"):
        assert secret not in rendered
    if server is not None:
        assert str(server.port) not in rendered


async def test_no_address_or_password_in_open_errors(own_redis_server: RedisServer) -> None:
    port = own_redis_server.port
    own_redis_server.stop()
    for url in (
        f"redis://:{SECRET}@127.0.0.1:{port}/0",
        f"redis://user:{SECRET}@127.0.0.1:{port}/0",
        f"redis://127.0.0.1:{port}/0?password={SECRET}",
        f"notredis://{SECRET}@127.0.0.1:{port}",
        f"redis://127.0.0.1:{SECRET}/0",
    ):
        with pytest.raises(StoreUnavailable) as caught:
            await open_redis_backend(url, connect_timeout_s=0.3)
        _assert_clean(caught.value, own_redis_server)
    own_redis_server.start()
    admin = Redis.from_url(own_redis_server.url)
    try:
        await admin.config_set("requirepass", "the-right-one")
    finally:
        await admin.aclose()
    for url in (own_redis_server.url, f"redis://:{SECRET}@127.0.0.1:{port}/0"):
        with pytest.raises(StoreUnavailable) as caught:  # no or a wrong password
            await open_redis_backend(url)
        _assert_clean(caught.value, own_redis_server)
    backend = await open_initialised(f"redis://:the-right-one@127.0.0.1:{port}/0")
    await backend.close()
    with pytest.raises(StoreUnavailable) as caught:
        await open_redis_backend(own_redis_server.url, prefix="bad:prefix")
    _assert_clean(caught.value, own_redis_server)


async def test_history_reads_stay_consistent_with_a_second_instance(
    redis_h: RedisHarness,
) -> None:
    writer, reader = await redis_h.open(), await redis_h.open()
    tenant = unique("t")
    await conversation(writer, tenant)
    acks = await _commit_many(writer, tenant, 5)
    page = await reader.store.history_page(HistoryQuery(tenant, "c1", "alice", limit=3))
    assert [r.seq for r in page.records] == [5, 4, 3] and page.next_anchor == 3
    assert page.last_seq == 5 and page.available_from_seq == 1
    assert [a.seq for a in acks] == [1, 2, 3, 4, 5]


async def test_out_of_memory_refuses_writes_whole_and_still_serves_reads(
    own_redis_server: RedisServer,
) -> None:
    backend = await open_initialised(own_redis_server.url, prefix="oom")
    admin = Redis.from_url(own_redis_server.url)
    try:
        tenant = unique("t")
        await conversation(backend, tenant)
        c = committer(backend)
        req = send(tenant)
        ack = await c.commit_send(req)
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")
        before = await snapshot(admin, "oom")
        with pytest.raises(Recoverable):
            await c.commit_send(send(tenant))
        with pytest.raises(StoreUnavailable) as caught:
            await backend.membership.add_members(tenant, "c1", ["carol"])
        _assert_clean(caught.value, own_redis_server)
        assert await snapshot(admin, "oom") == before
        assert await c.commit_send(req) == ack  # replays are reads
        page = await backend.store.history_page(HistoryQuery(tenant, "c1", "bob"))
        assert [r.message_id for r in page.records] == [ack.message_id]
        await admin.config_set("maxmemory", "0")
        assert (await c.commit_send(send(tenant))).seq == 2
    finally:
        await admin.aclose()
        await backend.close()
