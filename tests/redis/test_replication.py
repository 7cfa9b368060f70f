"""Asynchronous replicas and WAIT: which ACK a failover can take away.

Redis replicates asynchronously. Without ``MC_REDIS_WAIT_REPLICAS`` an ACK means
"the primary has it": a primary that dies before its replica got the commit,
followed by that replica's promotion, loses an ACKed message. With
``wait_replicas=1`` no committed result becomes an ACK (fresh, replayed or
re-read) until a replica acknowledged it (WAIT on the same connection), so the
same failover loses nothing that was acknowledged: the send answers
recoverable, and a retry of the same key finishes it on the new primary.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
from redis import Redis
from redis import exceptions as rx
from redis.asyncio.connection import AbstractConnection

from backends.redis.commits import RESERVE
from backends.redis.link import CALL, Arg
from backends.redis.store import RedisMessageStore
from service.domain.errors import (
    ConversationNotFound,
    IdempotencyConflict,
    NotAMember,
    Recoverable,
    StoreNotReplicated,
    StoreOutcomeUnknown,
)
from service.domain.model import Admission, HistoryQuery, ReserveCandidate, Reserved
from service.domain.ports import Backend
from tests.redis.conftest import Wire
from tests.servers.redis_server import RedisServer, open_initialised
from tests.servers.redis_topologies import online_replicas
from tests.support import committer, conversation, send, text, unique

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def replica(own_redis_server: RedisServer) -> Iterator[RedisServer]:
    server = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(own_redis_server.port)])
    server.start()
    try:
        _wait_in_sync(own_redis_server.url, server.url)
        yield server
    finally:
        server.close()


def _wait_in_sync(primary: str, replica: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    with Redis.from_url(primary) as p, Redis.from_url(replica) as r:
        port = int(r.connection_pool.connection_kwargs["port"])
        while time.monotonic() < deadline:
            info, primary_info = r.info("replication"), p.info("replication")
            # WAIT counts the replica only once its primary calls it online
            online = port in online_replicas(primary_info)
            linked = info.get("master_link_status") == "up" and online
            if linked and info.get("master_repl_offset") == primary_info["master_repl_offset"]:
                return
            time.sleep(0.05)
    raise AssertionError("the replica did not catch up")


def _pause(server: RedisServer) -> None:
    assert server._process is not None
    os.kill(server._process.pid, signal.SIGSTOP)


def _resume(server: RedisServer) -> None:
    assert server._process is not None
    os.kill(server._process.pid, signal.SIGCONT)


def _promote(replica: RedisServer) -> None:
    with Redis.from_url(replica.url) as r:
        r.execute_command("REPLICAOF", "NO", "ONE")


WAIT_MS = 1500
"""MC_REDIS_WAIT_TIMEOUT here: a paused replica never answers, whatever the value,
but a running one must answer within it even on a loaded box (300 ms was not enough
there: a commit before the pause failed once, at load 27)."""


async def _open(url: str, wait: int) -> Backend:
    return await open_initialised(url, wait_replicas=wait, wait_timeout_ms=WAIT_MS)


async def test_without_wait_a_failover_can_lose_an_acked_commit(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    backend = await _open(own_redis_server.url, wait=0)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        before = await c.commit_send(send(tenant))
        _wait_in_sync(own_redis_server.url, replica.url)
        _promote(replica)  # cut off (a partition): from now on it misses the stream
        lost = await c.commit_send(send(tenant))  # ACKed by the primary alone
    finally:
        await backend.close()
    own_redis_server.kill()  # the primary dies; the cut-off replica takes over
    promoted = await open_initialised(replica.url)
    try:
        survivor = committer(promoted)
        loaded = await promoted.store.load_commit(send(tenant, cmid=lost.cmid).key, "c1")
        assert loaded is None, "the ACKed commit reached the replica after all"
        assert before.seq == 1 and lost.seq == 2
        again = await survivor.commit_send(send(tenant, cmid=lost.cmid))
        assert again.message_id != lost.message_id  # a second message for an ACKed key
    finally:
        await promoted.close()


async def test_with_wait_no_acked_commit_is_lost_on_failover(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        kept = await c.commit_send(send(tenant))  # the replica acknowledged it
        assert await c.commit_send(send(tenant, cmid=kept.cmid)) == kept  # replays wait too
        _pause(replica)
        pending = send(tenant)
        with pytest.raises(Recoverable):  # applied on the primary, not replicated: no ACK
            await c.commit_send(pending)
        with pytest.raises(Recoverable):  # and a retry against the same primary waits again
            await c.commit_send(pending)
    finally:
        await backend.close()
    own_redis_server.kill()
    _resume(replica)
    _promote(replica)
    promoted = await open_initialised(replica.url, wait_replicas=0)
    try:
        survivor = committer(promoted)
        assert await survivor.commit_send(send(tenant, cmid=kept.cmid)) == kept
        finished = await survivor.commit_send(pending)  # the retry finishes it, once
        assert finished.seq > kept.seq
    finally:
        await promoted.close()


async def test_waiting_costs_a_round_trip_only_on_the_ack(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    plain, waiting = await _open(own_redis_server.url, 0), await _open(own_redis_server.url, 1)
    tenant = unique("t")
    try:
        await conversation(plain, tenant)
        counts = []
        for backend in (plain, waiting):
            c = committer(backend)
            before = backend.requests["redis_call"]
            await c.commit_send(send(tenant))
            counts.append(backend.requests["redis_call"] - before)
        assert counts == [2, 2]  # WAIT rides in the commit pipeline's round trip
        await asyncio.sleep(0)
    finally:
        await plain.close()
        await waiting.close()


async def test_with_wait_a_refusal_waits_for_replicas_too(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    """A conflict, an unknown conversation or a non-member is refused only when a
    replica holds the state the refusal rests on: a primary cut off from its replicas
    (a demoted one still answering) may be missing the write that would change it."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        kept = await c.commit_send(send(tenant))
        reuse = send(tenant, cmid=kept.cmid, content=text("something else"))
        outsider = send(tenant, sender="mallory")
        unknown = send(tenant, conversation="nowhere")
        _pause(replica)
        try:
            # All three are refused by the reserve script (admission is part of it):
            # retry the same key (UNAVAILABLE over gRPC, as before)
            for refused in (reuse, outsider, unknown):
                with pytest.raises(Recoverable):
                    await c.commit_send(refused)
        finally:
            _resume(replica)
        _wait_in_sync(own_redis_server.url, replica.url)
        with pytest.raises(IdempotencyConflict):
            await c.commit_send(reuse)
        with pytest.raises(NotAMember):
            await c.commit_send(outsider)
        with pytest.raises(ConversationNotFound):
            await c.commit_send(unknown)
    finally:
        await backend.close()


async def test_with_wait_a_membership_change_waits_for_replicas(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    """An add, a removal or a new conversation acknowledged by a primary alone could
    vanish in a failover (a paused primary resumes before Sentinel demotes it), and
    every commit after it would then leave the added user out: the e2e nemesis
    (seed 3117) saw a device miss a conversation's messages after such an add. With
    ``wait_replicas=1`` they are answered only once a replica holds them."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    m = backend.membership
    try:
        await m.create_conversation(tenant, "c1", ["alice", "bob"])
        _pause(replica)
        try:
            with pytest.raises(StoreNotReplicated):
                await m.add_members(tenant, "c1", ["carol"])
            with pytest.raises(StoreNotReplicated):
                await m.remove_members(tenant, "c1", ["bob"])
            with pytest.raises(StoreNotReplicated):
                await m.create_conversation(tenant, "c2", ["alice"])
        finally:
            _resume(replica)
        _wait_in_sync(own_redis_server.url, replica.url)
        info = await m.add_members(tenant, "c1", ["dave"])  # answered once replicated
        assert info.conversation == "c1"
    finally:
        await backend.close()


async def _history_seqs(backend: Backend, tenant: str, seqs: Sequence[int]) -> list[int]:
    page = await backend.store.history_page(HistoryQuery(tenant, "c1", "bob"))
    return sorted(r.seq for r in page.records if r.seq in seqs)


async def _relay_seqs(backend: Backend, tenant: str, seqs: Sequence[int]) -> list[int]:
    assert backend.delivery is not None
    return sorted(await backend.delivery.records.records(tenant, "c1", seqs))


@pytest.mark.parametrize("read", [_history_seqs, _relay_seqs], ids=["history", "relay"])
async def test_with_wait_reads_show_only_what_replicas_hold(
    own_redis_server: RedisServer,
    replica: RedisServer,
    read: Callable[[Backend, str, Sequence[int]], Awaitable[list[int]]],
) -> None:
    """A send whose WAIT failed is on the primary alone: a failover can lose it and
    give its seq to another message. With ``wait_replicas=1`` a read answers only once
    a replica holds what it shows.

    History: a page served from that primary (a paused one that resumed before
    Sentinel demoted it) showed it, so a device stored a message that never existed
    and was later told a different one holds its seq (the e2e nemesis, seed 3117:
    both devices of a user stuck on "two different messages arrived for one
    conversation seq").

    Relay: it plans a delivery from the record it reads. One read from a primary
    alone, appended after a failover to the new primary, which never had it, left a
    mailbox entry for a message that does not exist while the sender's retry
    committed the key again under another message id (the Sentinel delivery soak,
    "another message id than its ACK's")."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        kept = await c.commit_send(send(tenant))
        seqs = [kept.seq, kept.seq + 1]
        _pause(replica)
        try:
            with pytest.raises(Recoverable):  # on the primary only: no ACK
                await c.commit_send(send(tenant))
            with pytest.raises(StoreNotReplicated):  # nor a read that shows it
                await read(backend, tenant, seqs)
        finally:
            _resume(replica)
        _wait_in_sync(own_redis_server.url, replica.url)
        assert await read(backend, tenant, seqs) == seqs  # replicated: answered again
    finally:
        await backend.close()


def _store(backend: Backend) -> RedisMessageStore:
    assert isinstance(backend.store, RedisMessageStore)
    return backend.store


async def test_with_wait_a_replay_or_a_refusal_is_one_round_trip(
    own_redis_server: RedisServer, replica: RedisServer, wire: Wire
) -> None:
    """Issue 27 with replicas: the reserve that finds the key committed (or refuses
    it), the barrier and WAIT go in one pipeline, so a replay costs what it costs
    without WAIT, and so does a refusal that rests on stored state."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        request = send(tenant)
        ack = await c.commit_send(request)
        costs = []
        writes, calls = wire.writes, backend.requests[CALL]
        assert await c.commit_send(request) == ack
        costs.append((wire.writes - writes, backend.requests[CALL] - calls))
        refusals: list[tuple[Any, type[Exception]]] = [
            (send(tenant, cmid=ack.cmid, content=text("something else")), IdempotencyConflict),
            (send(tenant, conversation="nowhere"), ConversationNotFound),
        ]
        for refused, error in refusals:
            writes, calls = wire.writes, backend.requests[CALL]
            with pytest.raises(error):
                await c.commit_send(refused)
            costs.append((wire.writes - writes, backend.requests[CALL] - calls))
        # Not a member: the store's answer (the committer then re-reads the key,
        # off the hot path: a refused send may be a retry of an admitted one)
        writes, calls = wire.writes, backend.requests[CALL]
        outsider = send(tenant, sender="mallory")
        refused = await _store(backend).reserve_admitted(outsider, None, ReserveCandidate("m", 7))
        assert refused == Admission(1, False)
        costs.append((wire.writes - writes, backend.requests[CALL] - calls))
        expected = [(1, 1)] * 4
        assert costs == expected, f"(socket writes, calls): replay, 3 refusals: {costs}"
    finally:
        await backend.close()


async def test_with_wait_the_barrier_is_on_the_connection_that_answered(
    own_redis_server: RedisServer, replica: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replicas that acknowledge must hold what the server that answered the
    reserve holds: its barrier and WAIT go in the same pipeline, on the same
    connection, not in a second call the pool may send to another server (after a
    failover, a stale primary may answer "committed" for a commit the new one lost)."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    link = _store(backend).replication.link
    barrier = _store(backend).replication.keys.conversation(tenant, "c1").shard.barrier
    try:
        await conversation(backend, tenant)
        c = committer(backend)
        request = send(tenant)
        ack = await c.commit_send(request)
        sent: list[tuple[str, list[tuple[Arg, ...]]]] = []
        scripts, execute = link._scripts, link._execute

        async def together(
            commands: Sequence[Sequence[Arg]], key: str | None = None
        ) -> list[Any]:  # one exchange (or, traced, one driver pipeline): ONE connection
            sent.append(("one connection", [tuple(command[:2]) for command in commands]))
            return await scripts(commands, key)

        async def alone(*args: Arg) -> Any:
            sent.append(("alone", [tuple(args[:2])]))
            return await execute(*args)

        monkeypatch.setattr(link, "_scripts", together)
        monkeypatch.setattr(link, "_execute", alone)
        assert await c.commit_send(request) == ack
        with pytest.raises(IdempotencyConflict):
            await c.commit_send(send(tenant, cmid=ack.cmid, content=text("something else")))
        pipeline = [("EVALSHA", RESERVE.sha), ("INCR", barrier), ("WAIT", 1)]
        assert sent == [("one connection", pipeline)] * 2
    finally:
        await backend.close()


async def test_with_wait_a_fresh_reserve_leaves_the_ack_to_the_commit(
    own_redis_server: RedisServer, replica: RedisServer
) -> None:
    """A fresh reservation rests on nothing stored before it: its WAIT count is not
    checked (the commit pipeline's own WAIT decides the ACK), so a slow replica does
    not refuse a reserve that the commit may still get acknowledged."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)
        _pause(replica)
        try:
            reserved = await _store(backend).reserve_admitted(
                send(tenant), None, ReserveCandidate("m-fresh", 7)
            )
        finally:
            _resume(replica)
        assert isinstance(reserved, Reserved)
    finally:
        await backend.close()


async def test_with_wait_a_reserve_whose_reply_is_lost_is_an_unknown_outcome(
    own_redis_server: RedisServer, replica: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reserve pipeline writes (it may reserve): a connection lost under it is
    an unknown outcome, never "unavailable" (which says nothing was written)."""
    backend = await _open(own_redis_server.url, wait=1)
    tenant = unique("t")
    try:
        await conversation(backend, tenant)

        async def lost(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
            raise rx.ConnectionError("the connection dropped")

        monkeypatch.setattr(AbstractConnection, "send_packed_command", lost)
        with pytest.raises(StoreOutcomeUnknown):
            await _store(backend).reserve_admitted(
                send(tenant), None, ReserveCandidate("m-lost", 7)
            )
    finally:
        monkeypatch.undo()
        await backend.close()
