"""The client runtime's main guarantees end to end, unchanged on every deployment
(``tests/client/deployments.py``): memory (in-process replica, restarted on a
surviving state) and Redis (real ``serve`` processes, SIGKILLed)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from client import (
    CursorExpired,
    LocalStoreReset,
    MessagesAdded,
    RebuildFinished,
    RebuildStarted,
    SendConfirmed,
)
from client.faults import ClientCrash, ClientPoint
from service.domain.mailbox import INBOX, MailboxCursor
from tests.client.deployments import Deployment, MemoryDeployment, ProcessDeployment, create
from tests.client.support import (
    FAST,
    Client,
    admin,
    eventually,
    history,
    lane_head,
    sync_expired,
)
from tests.servers.redis_server import initialise_prefix
from tests.support import unique

pytestmark = pytest.mark.e2e


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("scylla", marks=pytest.mark.scylla),
    ]
)
async def deployment(request: pytest.FixtureRequest) -> AsyncIterator[Deployment]:
    marker = request.node.get_closest_marker("server")
    overrides = marker.kwargs if marker else {}
    d: Deployment
    if request.param == "memory":
        d = MemoryDeployment(**overrides)
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = unique("mcc")
        await initialise_prefix(url, prefix)
        env = {"MC_REDIS_URL": url, "MC_REDIS_PREFIX": prefix}
        d = ProcessDeployment("redis", ["--backend", "redis"], env, **overrides)
    else:
        host, port = request.getfixturevalue("cql_contact")
        keyspace = request.getfixturevalue("cql_keyspace")
        env = {
            "MC_SCYLLA_CONTACT_POINTS": host,
            "MC_SCYLLA_PORT": str(port),
            "MC_SCYLLA_KEYSPACE": keyspace,
        }
        d = ProcessDeployment("scylla", ["--backend", "scylla"], env, **overrides)
    await d.start()
    await create(d, "general", ["alice", "bob"])
    await create(d, "side", ["alice", "bob"])
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def pair(deployment: Deployment, tmp_path: Path) -> AsyncIterator[tuple[Client, Client]]:
    t = deployment.tenant
    alice = Client("alice", tmp_path / "alice.db", lambda: deployment.target, tenant=t)
    bob = Client("bob", tmp_path / "bob.db", lambda: deployment.target, tenant=t)
    yield alice, bob
    await alice.crash()
    await bob.crash()


async def no_pending(client: Client) -> bool:
    return not await client.rt.store.pending()


async def count(client: Client, n: int, conversation: str = "general") -> bool:
    return len(await client.rt.store.messages(conversation, limit=10_000)) >= n


def confirmations(client: Client, cmid: str) -> list[SendConfirmed]:
    return [e for e in client.events if isinstance(e, SendConfirmed) and e.cmid == cmid]


async def has_confirmation(client: Client, cmid: str) -> bool:
    return bool(confirmations(client, cmid))


async def crashed(client: Client) -> bool:
    return client.rt.crash is not None


async def test_a_lost_ack_with_the_server_killed_is_reconciled_by_cmid(
    deployment: Deployment, pair: tuple[Client, Client]
) -> None:
    """The server commits and answers, alice dies before she sees the ACK, the
    server is killed. After both restart, alice finds her send by its cmid:
    exactly one message, at the coordinates the server gave it."""
    alice, bob = pair
    await alice.start()
    await bob.start()
    await alice.online()
    await deployment.hold_delivery()  # only reconciliation can confirm it
    alice.faults.arm(ClientPoint.SENT_BEFORE_ACK)
    cmid = await alice.send("general", "did my message make it?")
    await eventually(lambda: crashed(alice))
    await alice.crash()
    await deployment.kill()
    await deployment.start()
    [committed] = await history(deployment.target, "general", "alice", deployment.tenant)
    assert committed.cmid == cmid

    await alice.start()
    await eventually(lambda: has_confirmation(alice, cmid))
    [event] = confirmations(alice, cmid)
    assert event.via == "resume"
    assert (event.message.seq, event.message.message_id) == (committed.seq, committed.message_id)
    assert [m.record for m in await alice.rt.store.messages("general")] == [committed]

    await deployment.release_delivery()
    await eventually(lambda: count(bob, 1), 30)
    await eventually(lambda: _inbox_at(alice, 1), 30)
    assert await history(deployment.target, "general", "bob", deployment.tenant) == [committed]
    assert alice.added_ids() == [committed.message_id]  # the mailbox copy was deduped
    assert bob.added_ids() == [committed.message_id]
    assert len(confirmations(alice, cmid)) == 1


async def _inbox_at(client: Client, seq: int) -> bool:
    cursor = await client.rt.store.cursor("inbox")
    return cursor is not None and cursor.seq >= seq


async def test_bob_offline_during_100_sends_syncs_each_exactly_once_in_order(
    deployment: Deployment, pair: tuple[Client, Client]
) -> None:
    alice, bob = pair
    await bob.start()
    await bob.online()
    await bob.crash()
    await alice.start()
    await alice.online()
    cmids = [await alice.send("general", f"message {i}", cmid=f"m-{i:03}") for i in range(100)]
    await eventually(lambda: no_pending(alice), 120)
    await bob.start()
    await eventually(lambda: count(bob, 100), 120)
    stored = await bob.rt.store.messages("general", limit=1000)
    assert [m.record.cmid for m in stored] == cmids
    assert [m.record for m in stored] == await history(
        deployment.target, "general", "bob", deployment.tenant
    )
    added = [m for e in bob.events if isinstance(e, MessagesAdded) for m in e.messages]
    assert [m.record.cmid for m in added] == cmids  # once each, in order


@pytest.mark.server(mailbox_max_entries=10)
async def test_a_trimmed_mailbox_rebuilds_with_nothing_lost_or_duplicated_and_pending_kept(
    deployment: Deployment, pair: tuple[Client, Client]
) -> None:
    alice, bob = pair
    await alice.start()
    await bob.start()
    for i in range(5):
        await alice.send("general", f"early {i}")
    await eventually(lambda: count(bob, 5), 30)
    left_at = await bob.rt.store.cursor(INBOX)
    assert left_at is not None
    bob.faults.arm(ClientPoint.AFTER_PERSIST)
    with pytest.raises(ClientCrash):
        await bob.send("side", "written while offline", cmid="bob-pending")
    await bob.crash()
    for i in range(30):
        await alice.send("general" if i % 3 else "side", f"late {i}")
    await eventually(lambda: no_pending(alice), 60)
    # Committed is not delivered: the relay may still be filling bob's inbox (CI saw
    # bob back early, following the appends live, never expired). He comes back once
    # the server has trimmed past where he left off and holds all thirty.
    target, tenant = deployment.target, deployment.tenant
    gone = MailboxCursor(INBOX, left_at.epoch, left_at.seq)
    await eventually(lambda: sync_expired(target, tenant, "bob", gone), 60)
    await eventually(lambda: _head_at(target, tenant, "bob", left_at.seq + 30), 60)

    await bob.start()
    await eventually(lambda: no_pending(bob), 60)
    await eventually(lambda: _mirrors_server(deployment, bob), 60)
    kinds = [type(e) for e in bob.events]
    assert kinds.index(CursorExpired) < kinds.index(RebuildStarted) < kinds.index(RebuildFinished)
    [sent] = confirmations(bob, "bob-pending")
    assert bob.events.index(sent) > kinds.index(RebuildFinished)  # kept through the rebuild
    assert Counter(bob.added_ids()).most_common(1)[0][1] == 1
    side = await history(deployment.target, "side", "bob", deployment.tenant)
    assert [r.cmid for r in side if r.sender == "bob"] == ["bob-pending"]


async def _head_at(target: str, tenant: str, user: str, seq: int) -> bool:
    return await lane_head(target, tenant, user, INBOX) >= seq


async def _mirrors_server(deployment: Deployment, client: Client) -> bool:
    for conversation in ("general", "side"):
        server = await history(deployment.target, conversation, client.user, deployment.tenant)
        local = await client.rt.store.messages(conversation, limit=1000)
        if [m.record for m in local] != server:
            return False
    return True


@pytest.mark.parametrize("damage", ["newer", "corrupt"])
async def test_a_corrupt_or_newer_local_schema_resets_with_pending_kept(
    deployment: Deployment, pair: tuple[Client, Client], damage: str
) -> None:
    alice, bob = pair
    await alice.start()
    await bob.start()
    for i in range(3):
        await alice.send("general", f"before {i}")
    await eventually(lambda: count(bob, 3), 30)
    bob.faults.arm(ClientPoint.AFTER_PERSIST)
    with pytest.raises(ClientCrash):
        await bob.send("general", "kept across the reset", cmid="bob-keep")
    await bob.crash()
    db = sqlite3.connect(bob.path)
    if damage == "newer":
        db.execute("PRAGMA user_version = 99")
    else:  # a table that lost a column this runtime needs
        db.execute("ALTER TABLE messages DROP COLUMN origin")
    db.close()

    bob.events.clear()
    await bob.start()
    await eventually(lambda: has_confirmation(bob, "bob-keep"), 30)
    assert isinstance(bob.events[0], LocalStoreReset)
    assert bob.events[0].kept_pending == 1
    await eventually(lambda: _mirrors_server(deployment, bob), 30)
    server = await history(deployment.target, "general", "bob", deployment.tenant)
    assert [r.cmid for r in server].count("bob-keep") == 1
    assert Counter(bob.added_ids()).most_common(1)[0][1] == 1


ORDERINGS = {
    # The e2e nemesis run (seed 3101): removed, new epoch, the device back, re-added.
    "removed-epoch-back-readded": ("remove", "epoch", "back", "readd"),
    "epoch-removed-back-readded": ("epoch", "remove", "back", "readd"),
    "removed-epoch-readded-back": ("remove", "epoch", "readd", "back"),
}


async def _holds(client: Client, message_id: str) -> bool:
    stored = await client.rt.store.messages("general", limit=100)
    return message_id in {m.message_id for m in stored}


async def _rebuilt(client: Client) -> bool:
    return any(isinstance(e, RebuildFinished) for e in client.events)


# Every ordering on memory (the client's logic); the first, the nemesis's, on Redis and
# CQL too (what they add is History's answer to a former member, the same each time).
ACROSS_BACKENDS = [
    *((pytest.param("memory", o, id=f"memory-{o}")) for o in ORDERINGS),
    pytest.param("redis", "removed-epoch-back-readded", marks=pytest.mark.redis,
                 id="redis-removed-epoch-back-readded"),
    pytest.param("scylla", "removed-epoch-back-readded", marks=pytest.mark.scylla,
                 id="scylla-removed-epoch-back-readded"),
]  # fmt: skip


@pytest.mark.parametrize(("deployment", "ordering"), ACROSS_BACKENDS, indirect=["deployment"])
async def test_a_device_back_after_a_new_epoch_gets_what_was_committed_while_a_member(
    deployment: Deployment, tmp_path: Path, ordering: str
) -> None:
    """Device bob/a goes offline holding part of ``general``; more is committed; bob
    is removed, his inbox starts a new epoch, bob/a comes back (CursorExpired ->
    REBUILD) and bob is added again, in each ordering. bob/a ends holding what
    bob/b (online throughout) holds, and what History shows bob: the messages
    committed while bob was a member, none of those committed while he was not."""
    t = deployment.tenant
    target = lambda: deployment.target  # noqa: E731
    alice = Client("alice", tmp_path / "alice.db", target, tenant=t)
    bob_a = Client("bob", tmp_path / "bob-a.db", target, tenant=t, device="a")
    bob_b = Client("bob", tmp_path / "bob-b.db", target, tenant=t, device="b")
    try:
        for c in (alice, bob_a, bob_b):
            await c.start()
        for i in range(3):
            await alice.send("general", f"seen by both {i}")
        await eventually(lambda: count(bob_a, 3), 30)
        await eventually(lambda: count(bob_b, 3), 30)
        await bob_a.crash()
        for i in range(3):
            await alice.send("general", f"while bob/a is away {i}")
        await eventually(lambda: count(bob_b, 6), 30)

        for step in ORDERINGS[ordering]:
            if step == "remove":
                async with await admin(deployment.target) as admin_client:
                    await admin_client.remove_members(t, "general", ["bob"])
                await alice.send("general", "while bob is out")
                await eventually(lambda: no_pending(alice), 30)
            elif step == "epoch":
                await deployment.new_epoch("bob")
            elif step == "back":
                await bob_a.start()
                await eventually(lambda: _rebuilt(bob_a), 30)
            else:
                async with await admin(deployment.target) as admin_client:
                    await admin_client.add_members(t, "general", ["bob"])
        for i in range(2):
            await alice.send("general", f"after the re-add {i}")
        await eventually(lambda: no_pending(alice), 30)

        server = await history(deployment.target, "general", "bob", t)
        assert len(server) == 8  # 3 + 3 + 2: the one sent while bob was out is hidden
        await eventually(lambda: _holds(bob_b, server[-1].message_id), 30)
        await eventually(lambda: _holds(bob_a, server[-1].message_id), 30)
        on_b = [m.record for m in await bob_b.rt.store.messages("general", limit=100)]
        on_a = [m.record for m in await bob_a.rt.store.messages("general", limit=100)]
        assert [r.seq for r in on_b] == [r.seq for r in server]
        assert [r.seq for r in on_a] == [r.seq for r in on_b]  # the device that was away
        assert on_a == on_b == server
    finally:
        for c in (alice, bob_a, bob_b):
            await c.crash()


async def test_a_device_that_held_nothing_of_a_conversation_left_gets_it_on_rebuild(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Device bob/c syncs once (before anything is sent to ``general``) and goes
    offline; messages are committed to ``general`` while bob is a member; bob is
    removed and his inbox starts a new epoch; bob/c comes back (CursorExpired ->
    REBUILD). It held nothing of ``general``, and ``general`` is no longer listed,
    yet it must end holding what History shows bob there (the sibling bob/b, online
    throughout, holds the same)."""
    t = deployment.tenant
    target = lambda: deployment.target  # noqa: E731
    alice = Client("alice", tmp_path / "alice.db", target, tenant=t)
    bob_b = Client("bob", tmp_path / "bob-b.db", target, tenant=t, device="b")
    bob_c = Client("bob", tmp_path / "bob-c.db", target, tenant=t, device="c")
    try:
        for c in (alice, bob_b, bob_c):
            await c.start()
        await bob_c.online()
        await bob_c.crash()  # synced once, holds nothing of general
        for i in range(3):
            await alice.send("general", f"while bob/c is away {i}")
        await eventually(lambda: count(bob_b, 3), 30)
        async with await admin(deployment.target) as admin_client:
            await admin_client.remove_members(t, "general", ["bob"])
        await alice.send("general", "while bob is out")
        await eventually(lambda: no_pending(alice), 30)
        await deployment.new_epoch("bob")

        await bob_c.start()
        await eventually(lambda: _rebuilt(bob_c), 30)
        server = await history(deployment.target, "general", "bob", t)
        assert len(server) == 3  # the one sent while bob was out is hidden
        on_c = [m.record for m in await bob_c.rt.store.messages("general", limit=100)]
        on_b = [m.record for m in await bob_b.rt.store.messages("general", limit=100)]
        assert on_b == server
        assert on_c == server, "the device that held nothing of general lost it for good"
    finally:
        for c in (alice, bob_b, bob_c):
            await c.crash()


# The bound is the client's (RuntimeConfig.rebuild_left_margin_s); the servers' answer
# to left_after_ms is tests/conformance/test_mailbox.py's, on every backend.
@pytest.mark.parametrize("deployment", ["memory"], indirect=True)
@pytest.mark.parametrize(("margin_s", "backfilled"), [(0.0, False), (86_400.0, True)])
async def test_a_rebuild_asks_only_for_departures_after_what_the_device_read(
    deployment: Deployment, tmp_path: Path, margin_s: float, backfilled: bool
) -> None:
    """bob leaves ``quiet`` (nothing was ever sent there), then bob/c reads a
    message of ``side`` from its inbox, goes away, and the inbox starts a new
    epoch. The departure is older than the newest message bob/c read: with no
    margin the rebuild does not target ``quiet`` (nothing of it can have been
    in the lane past what bob/c read); with the default margin it does."""
    t = deployment.tenant
    target = lambda: deployment.target  # noqa: E731
    await create(deployment, "quiet", ["alice", "bob"])
    config = replace(FAST, rebuild_left_margin_s=margin_s)
    alice = Client("alice", tmp_path / "alice.db", target, tenant=t)
    bob_c = Client("bob", tmp_path / "bob-c.db", target, tenant=t, device="c", config=config)
    try:
        async with await admin(deployment.target) as admin_client:
            await admin_client.remove_members(t, "quiet", ["bob"])
        for c in (alice, bob_c):
            await c.start()
        await alice.send("side", "read after bob left quiet")
        await eventually(lambda: count(bob_c, 1, "side"), 30)
        await bob_c.crash()
        await deployment.new_epoch("bob")
        await bob_c.start()
        await eventually(lambda: _rebuilt(bob_c), 30)
        [started] = [e for e in bob_c.events if isinstance(e, RebuildStarted)]
        assert "side" in started.plan.conversations
        assert ("quiet" in started.plan.conversations) is backfilled
    finally:
        for c in (alice, bob_c):
            await c.crash()
