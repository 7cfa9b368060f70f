"""The client runtime end to end over a real in-process server (memory backend,
its relay inside), killed and restarted on a state that outlives it."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from client import (
    AlreadyConnected,
    ClientRuntime,
    ConnectionState,
    ConnectRequest,
    ConnectRequired,
    CursorExpired,
    ExpiredCursor,
    GrpcConnector,
    InvalidArgument,
    MailboxCursor,
    MailboxPage,
    MemberPageRequest,
    MessagesAdded,
    Origin,
    RebuildStarted,
    SendConfirmed,
    SendMessage,
    open_local_store,
)
from client.faults import ClientCrash, ClientPoint
from service.domain.errors import CursorExpired as ServerCursorExpired
from service.domain.faults import FaultPoint, RelayPoint
from service.domain.mailbox import MailboxCursor as ServerCursor
from service.domain.model import AuthenticatedSend, HistoryQuery, MessageContent, MessageType
from tests.client.conftest import NewClient
from tests.client.support import (
    FAST,
    TENANT,
    Client,
    MemoryServers,
    admin,
    eventually,
    history,
    sync_expired,
    text,
)
from toolkit.campaign.faulty import CallFault

pytestmark = pytest.mark.e2e


async def confirmed(client: Client, cmid: str) -> list[SendConfirmed]:
    """The SendConfirmed events of ``cmid`` once there is one (and a moment more,
    so that a second one would be seen too)."""

    def found() -> list[SendConfirmed]:
        return [e for e in client.events if isinstance(e, SendConfirmed) and e.cmid == cmid]

    async def some() -> bool:
        return bool(found())

    await eventually(some)
    await asyncio.sleep(0.05)
    return found()


async def no_pending(client: Client) -> bool:
    return not await client.rt.store.pending()


async def test_network_commands_before_connect_raise_connect_required(
    servers: MemoryServers, tmp_path: Path
) -> None:
    store = await open_local_store(tmp_path / "x.db")
    runtime = ClientRuntime(store, GrpcConnector(servers.target), config=FAST)
    page = MailboxPage("inbox", (), MailboxCursor("inbox", 1, 0))
    calls = [
        runtime.send_message(SendMessage("general", text("hi"))),
        runtime.pull_history(HistoryQuery("", "general", "")),
        runtime.pull_members(MemberPageRequest("general")),
        runtime.apply_mailbox_batch(page),
        runtime.begin_rebuild(ExpiredCursor("inbox", 1, 0)),
        runtime.finish_rebuild(MailboxCursor("inbox", 1, 0)),
    ]
    for call in calls:
        with pytest.raises(ConnectRequired):
            await call
    assert await store.pending() == []
    assert runtime.state is ConnectionState.DISCONNECTED
    with pytest.raises(InvalidArgument):
        await runtime.connect(ConnectRequest("acme", "", "phone"))
    await runtime.connect(ConnectRequest(TENANT, "alice", "phone"))
    with pytest.raises(AlreadyConnected):
        await runtime.connect(ConnectRequest(TENANT, "alice", "phone"))
    await runtime.close()


async def test_send_and_receive_keep_message_type_and_custom_type(new_client: NewClient) -> None:
    alice, bob = new_client("alice"), new_client("bob")
    await alice.start()
    await bob.start()
    await alice.online()
    poll = MessageContent(MessageType.CUSTOM, b'{"q": "lunch?"}', custom_type="poll")
    image = MessageContent(MessageType.IMAGE, b"\x89PNG...")
    for content in (poll, image):
        await alice.rt.send_message(SendMessage("general", content))
    await eventually(lambda: no_pending(alice))
    await eventually(lambda: _count(bob, 2))
    for who, origin in ((alice, Origin.OWN), (bob, Origin.MAILBOX)):
        stored = await who.rt.store.messages("general")
        assert [m.record.content for m in stored] == [poll, image]
        assert {m.origin for m in stored} == {origin}
    added = [e for e in bob.events if isinstance(e, MessagesAdded)]
    assert [m.record.content.custom_type for e in added for m in e.messages] == ["poll", ""]
    assert Counter(bob.added_ids()) == Counter(m.message_id for m in stored)


async def _count(client: Client, n: int, conversation: str = "general") -> bool:
    return len(await client.rt.store.messages(conversation, limit=10_000)) >= n


async def _fired(servers: MemoryServers, point: RelayPoint) -> bool:
    return servers.faults.fired[point] > 0


async def _lane_reaches(servers: MemoryServers, user: str, lane: str, seq: int) -> bool:
    """Whether the newest entry of ``lane`` is the message at conversation ``seq``
    (read from the trim watermark on: the lane's start may be gone)."""
    cursor, newest = ServerCursor(lane, 1, 0), 0
    async with await admin(servers.target) as c:
        for _ in range(100):
            try:
                page = await c.sync(TENANT, user, cursor)
            except ServerCursorExpired as exc:
                cursor = ServerCursor(lane, exc.epoch, exc.trim_watermark)
                continue
            newest = max([newest, *(e.record.seq for e in page.entries)])
            if not page.more:
                break
            cursor = page.next_cursor
    return newest >= seq


async def test_a_send_persisted_before_a_crash_goes_out_once_after_the_restart(
    servers: MemoryServers, new_client: NewClient
) -> None:
    alice = new_client("alice")
    await alice.start()
    await alice.online()
    alice.faults.arm(ClientPoint.AFTER_PERSIST)
    with pytest.raises(ClientCrash):
        await alice.send("general", "written before the crash", cmid="a-1")
    assert alice.rt.state is not ConnectionState.ONLINE or alice.rt.crash is not None
    await alice.crash()
    assert await history(servers.target, "general", "alice") == []
    store = await open_local_store(alice.path)
    assert [p.cmid for p in await store.pending()] == ["a-1"]
    assert (await store.pending())[0].attempts == 0
    await store.close()
    await alice.start()
    await eventually(lambda: no_pending(alice))
    records = await history(servers.target, "general", "alice")
    assert [(r.cmid, r.content.body) for r in records] == [("a-1", b"written before the crash")]
    assert len(await confirmed(alice, "a-1")) == 1


async def test_ack_lost_with_the_server_killed_is_reconciled_by_cmid_after_both_restart(
    servers: MemoryServers, new_client: NewClient
) -> None:
    """The server commits and dies before answering; alice dies too. After both
    restart, ResumeExisting finds the send by its cmid: one message, the same
    coordinates, no second commit. (The relay is held off, so only
    reconciliation can confirm it; once it runs, the mailbox copy is deduped.)"""
    slow = replace(FAST, reconnect_initial_s=5.0, reconnect_max_s=5.0)
    alice, bob = new_client("alice", config=slow), new_client("bob")
    await alice.start()
    await bob.start()
    await alice.online()
    servers.hold_relay()  # no deliveries for now, through the restarts too
    servers.faults.arm(FaultPoint.AFTER_COMMIT_BEFORE_ACK)
    await alice.send("general", "did you get this?", cmid="lost-ack")
    await eventually(lambda: _left_online(alice))
    assert servers.faults.fired[FaultPoint.AFTER_COMMIT_BEFORE_ACK] == 1
    await servers.kill()
    await alice.crash()
    await servers.start()
    [committed] = await history(servers.target, "general", "alice")
    assert committed.cmid == "lost-ack"

    alice.config = FAST
    await alice.start()
    await eventually(lambda: no_pending(alice))
    [event] = await confirmed(alice, "lost-ack")
    assert event.via == "resume"
    assert (event.message.seq, event.message.message_id) == (committed.seq, committed.message_id)
    [mine] = await alice.rt.store.messages("general")
    assert mine.record == committed

    servers.faults.disarm_all()
    await servers.restart()
    await eventually(lambda: _count(bob, 1))
    await eventually(lambda: _cursor_at(alice, 1))
    assert [r.cmid for r in await history(servers.target, "general", "bob")] == ["lost-ack"]
    assert alice.added_ids() == [committed.message_id]
    assert bob.added_ids() == [committed.message_id]


async def _left_online(client: Client) -> bool:
    return client.rt.state is ConnectionState.DISCONNECTED


async def _cursor_at(client: Client, seq: int) -> bool:
    cursor = await client.rt.store.cursor("inbox")
    return cursor is not None and cursor.seq >= seq


async def test_a_send_counted_but_never_sent_is_not_found_and_resent_with_the_same_id(
    servers: MemoryServers, new_client: NewClient
) -> None:
    alice = new_client("alice")
    await alice.start()
    await alice.online()
    alice.faults.arm(ClientPoint.ATTEMPT_BEFORE_SEND)
    cmid = await alice.send("general", "second time lucky")
    await eventually(lambda: _crashed(alice))
    await alice.crash()
    await alice.start()
    await eventually(lambda: no_pending(alice))
    [record] = await history(servers.target, "general", "alice")
    assert record.cmid == cmid and record.content.body == b"second time lucky"
    [event] = await confirmed(alice, cmid)
    assert event.via == "ack" and event.message.seq == record.seq


async def _has(client: Client, kind: type) -> bool:
    return any(isinstance(e, kind) for e in client.events)


async def _crashed(client: Client) -> bool:
    return client.rt.crash is not None


async def test_a_commit_the_server_could_not_finish_is_retried_with_the_same_id(
    servers: MemoryServers, new_client: NewClient
) -> None:
    alice = new_client("alice")
    await alice.start()
    await alice.online()
    assert servers.store is not None
    servers.store.inject("reserve", CallFault.FAIL)
    cmid = await alice.send("general", "after a backend hiccup")
    await eventually(lambda: no_pending(alice))
    [record] = await history(servers.target, "general", "alice")
    assert record.cmid == cmid
    [event] = await confirmed(alice, cmid)
    assert event.via == "ack" and event.message.seq == record.seq
    assert servers.store.faults.fired[("reserve", CallFault.FAIL)] == 1


@pytest.mark.server(idempotency_window=0.5, history_retention=3600.0)
async def test_past_the_idempotency_window_a_lost_ack_is_found_in_history(
    servers: MemoryServers, new_client: NewClient
) -> None:
    """The server has forgotten the key (its window passed); ResumeExisting says
    "not found" and a resend would commit a second message. The runtime's own
    settings are the defaults (which assume a 7-day window): it learns the
    server's 0.5 s window from ResumeExisting's answer, looks in the
    conversation's history and finds its own message."""
    slow = replace(FAST, reconnect_initial_s=5.0, reconnect_max_s=5.0)
    alice = new_client("alice", config=slow)
    await alice.start()
    await alice.online()
    servers.hold_relay()
    servers.faults.arm(FaultPoint.AFTER_COMMIT_BEFORE_ACK)
    await alice.send("general", "long ago", cmid="old-send")
    await eventually(lambda: _left_online(alice))
    await alice.crash()
    await asyncio.sleep(1.0)
    send = AuthenticatedSend(TENANT, "alice", "phone", "general", "old-send", text("long ago"))
    async with await admin(servers.target) as c:
        assert await c.resume_existing(send) is None
    alice.config = FAST
    await alice.start()
    await eventually(lambda: no_pending(alice))
    [event] = await confirmed(alice, "old-send")
    assert event.via == "history"
    assert [r.cmid for r in await history(servers.target, "general", "alice")] == ["old-send"]


@pytest.mark.server(fanout_threshold=2, mailbox_max_entries=6, relay_batch=2)
async def test_a_big_conversation_syncs_and_rebuilds_on_a_lane_of_its_own(
    servers: MemoryServers, new_client: NewClient
) -> None:
    """Bob is away while ten messages go to the big conversation's lane, which keeps
    six entries. The relay is held off while they are sent, so its backlog is claimed
    together, the worst case: a relay step writes one group per lane, retention cuts
    only at group ends, so with the default batch the ten land as one group, the cut
    stops at bob's cursor and he never expires. Groups of at most two make the trim
    pass his cursor however the backlog is claimed."""
    async with await admin(servers.target) as c:
        await c.create_conversation(TENANT, "big", ["alice", "bob", "carol"])
    alice, bob = new_client("alice"), new_client("bob")
    await alice.start()
    for i in range(3):
        await alice.send("big", f"to many {i}")
    await eventually(lambda: no_pending(alice))
    await bob.start()
    await eventually(lambda: _count(bob, 3, "big"))
    lanes = {c.lane for c in await bob.rt.store.cursors()}
    assert "conversation:big" in lanes
    await bob.crash()
    # Hold the relay before any of the ten is claimed: it stops at its next claim,
    # a message to another conversation, and the ten wait for the next relay.
    servers.faults.arm(RelayPoint.AFTER_CLAIM)
    await alice.send("general", "the relay stops here")
    await eventually(lambda: _fired(servers, RelayPoint.AFTER_CLAIM))
    for i in range(10):
        await alice.send("big", f"while bob is away {i}")
    await eventually(lambda: no_pending(alice))
    await servers.restart()  # a relay again, with the whole backlog waiting
    # ACKed is not delivered: wait until the relay's appends trimmed the lane past
    # bob's cursor, or bob, back early, would follow them as they come and not expire;
    # and until it appended the last of the ten, or bob, rebuilt while it still
    # delivers, would see his new cursor trimmed too and expire twice (seen in CI).
    big_at_3 = ServerCursor("conversation:big", 1, 3)
    await eventually(lambda: sync_expired(servers.target, TENANT, "bob", big_at_3))
    await eventually(lambda: _lane_reaches(servers, "bob", "conversation:big", 13))
    await bob.start()
    await eventually(lambda: _count(bob, 13, "big"), 30)
    [expired] = [e for e in bob.events if isinstance(e, CursorExpired)]
    assert expired.lane == "conversation:big"
    [started] = [e for e in bob.events if isinstance(e, RebuildStarted)]
    assert started.plan.conversations == ("big",)
    local = [m.record for m in await bob.rt.store.messages("big", limit=100)]
    assert local == await history(servers.target, "big", "bob")
    assert Counter(bob.added_ids()).most_common(1)[0][1] == 1


@pytest.mark.server(fanout_threshold=2)
async def test_a_big_lane_listed_before_its_first_entry_is_synced_without_a_hint(
    servers: MemoryServers, new_client: NewClient
) -> None:
    """Subscribe looks for new big-conversation lanes once a minute, so it cannot hint
    a lane that had no entry when the stream began; the client syncs such a listed
    lane at each heartbeat instead, and gets its first messages within seconds."""
    async with await admin(servers.target) as c:
        await c.create_conversation(TENANT, "big", ["alice", "bob", "carol"])
    alice, bob = new_client("alice"), new_client("bob")
    await bob.start()
    await bob.online()  # listed "conversation:big" (3 members > 2), still empty
    await alice.start()
    for i in range(3):
        await alice.send("big", f"first {i}")
    await eventually(lambda: _count(bob, 3, "big"), 10)  # far below the minute


@pytest.mark.server(fanout_threshold=2, relay_batch=1)
async def test_a_late_joiner_applies_a_big_lane_whose_pages_skip_what_it_may_not_read(
    servers: MemoryServers, new_client: NewClient
) -> None:
    """One reading rule for every lane: dave joins the big conversation after two
    messages, so its lane's pages show him only the two sent after, with gaps in
    their seqs and a cursor past what he may not read. The runtime applies them
    and stores the cursor at the lane's head."""
    async with await admin(servers.target) as c:
        await c.create_conversation(TENANT, "big", ["alice", "bob", "carol"])
    alice = new_client("alice")
    await alice.start()
    for i in range(2):
        await alice.send("big", f"before dave {i}")
    await eventually(lambda: no_pending(alice))
    async with await admin(servers.target) as c:
        await eventually(lambda: _lane_head(c, "alice", 2))
        await c.add_members(TENANT, "big", ["dave"])
    for i in range(2):
        await alice.send("big", f"after dave {i}")
    await eventually(lambda: no_pending(alice))
    dave = new_client("dave")
    await dave.start()
    await eventually(lambda: _count(dave, 2, "big"))
    async with await admin(servers.target) as c:
        await eventually(lambda: _lane_head(c, "alice", 4))
    lane = "conversation:big"
    await eventually(lambda: _lane_cursor_at(dave, lane, 4))
    local = [m.record.seq for m in await dave.rt.store.messages("big", limit=100)]
    assert local == [3, 4]


async def _lane_head(c: Any, user: str, head: int) -> bool:
    page = await c.sync(TENANT, user, ServerCursor("conversation:big"), limit=1000)
    return bool(page.head >= head)


async def _lane_cursor_at(client: Client, lane: str, seq: int) -> bool:
    cursor = await client.rt.store.cursor(lane)
    return cursor is not None and cursor.seq == seq


@pytest.mark.server(mailbox_max_entries=4, relay_batch=1)
async def test_a_late_joiners_rebuild_backfills_only_what_it_may_read(
    servers: MemoryServers, new_client: NewClient
) -> None:
    """History follows the one reading rule: dave joins "club" after three
    messages, then is away while eight more trim his inbox past his cursor. His
    REBUILD backfills the conversation's History, which now shows him only the
    eight sent after he joined: before, the backfill stored the three sent
    before too, messages never addressed to him."""
    async with await admin(servers.target) as c:
        await c.create_conversation(TENANT, "club", ["alice", "bob"])
    alice = new_client("alice")
    await alice.start()
    for i in range(3):
        await alice.send("club", f"before dave {i}")
    await eventually(lambda: no_pending(alice))
    async with await admin(servers.target) as c:
        await c.add_members(TENANT, "club", ["dave"])
    dave = new_client("dave")
    await dave.start()
    await eventually(lambda: _lane_cursor_at(dave, "inbox", 0))
    await dave.crash()
    for i in range(8):
        await alice.send("club", f"while dave is away {i}")
    await eventually(lambda: no_pending(alice))
    inbox_at_0 = ServerCursor("inbox", 1, 0)
    await eventually(lambda: sync_expired(servers.target, TENANT, "dave", inbox_at_0))
    await dave.start()
    await eventually(lambda: _count(dave, 8, "club"), 30)
    assert any(isinstance(e, RebuildStarted) for e in dave.events)
    local = [m.record.seq for m in await dave.rt.store.messages("club", limit=100)]
    assert local == list(range(4, 12))  # not 1-3, sent before he joined
    readable = await history(servers.target, "club", "dave")
    assert [r.seq for r in readable] == local
