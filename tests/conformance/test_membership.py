"""Versioned membership (DESIGN §9): versions, paging, frozen-by-reference delivery,
admission and authorisation as point lookups, and release 1's inline form."""

from __future__ import annotations

import pytest

from service.domain.errors import (
    IdempotencyConflict,
    NotAMember,
    StoreAlreadyExists,
    StoreInvalid,
    StoreNotFound,
)
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.model import (
    FrozenDeliveryInput,
    HistoryQuery,
    InProgress,
    MembershipInfo,
    ReserveCandidate,
)
from service.domain.ports import ManualClock
from tests.conformance.harness import Harness
from tests.support import committer, conversation, members, send, text, unique


async def test_every_change_is_a_version_and_old_versions_stay_readable(
    harness: Harness,
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    m = backend.membership
    created = await m.create_conversation(tenant, "c1", ["u1", "u2", "u2"])
    assert (created.version, created.member_count) == (1, 2)
    with pytest.raises(StoreAlreadyExists):
        await m.create_conversation(tenant, "c1", ["u3"])
    added = await m.add_members(tenant, "c1", ["u3", "u4", "u1"])
    assert (added.version, added.member_count) == (2, 4)
    assert (await m.add_members(tenant, "c1", ["u1"])).version == 2  # no change, no version
    removed = await m.remove_members(tenant, "c1", ["u2", "nobody"])
    assert (removed.version, removed.member_count) == (3, 3)
    readded = await m.add_members(tenant, "c1", ["u2"])
    assert (readded.version, readded.member_count) == (4, 4)
    assert await members(backend, tenant, "c1", 1) == ["u1", "u2"]
    assert await members(backend, tenant, "c1", 2) == ["u1", "u2", "u3", "u4"]
    assert await members(backend, tenant, "c1", 3) == ["u1", "u3", "u4"]
    assert await members(backend, tenant, "c1") == ["u1", "u2", "u3", "u4"]
    info = await m.membership_info(tenant, "c1")
    assert info is not None and (info.version, info.member_count) == (4, 4)
    admission = await m.admission(tenant, "c1", "u2")
    assert admission is not None and (admission.version, admission.member) == (4, True)
    outsider = await m.admission(tenant, "c1", "nobody")
    assert outsider is not None and not outsider.member
    for bad in (0, 5):
        with pytest.raises(StoreInvalid):
            await m.members_at(tenant, "c1", bad, "", 10)
    with pytest.raises(StoreNotFound):
        await m.add_members(tenant, "missing", ["u1"])
    with pytest.raises(StoreNotFound):
        await m.members_at(tenant, "missing", None, "", 10)
    assert await m.membership_info(tenant, "missing") is None
    assert await m.admission(tenant, "missing", "u1") is None


async def test_member_pages_are_complete_ordered_and_bounded(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    m = backend.membership
    everyone = [f"user:{i:05d}~x" for i in range(2500)]  # ids that need encoding
    await m.create_conversation(tenant, "big", everyone[:1000])
    await m.add_members(tenant, "big", everyone[1000:2000])
    await m.add_members(tenant, "big", everyone[2000:])
    gone = everyone[10:20]
    await m.remove_members(tenant, "big", gone)
    expected = [u for u in everyone if u not in gone]
    assert await members(backend, tenant, "big", page=1000) == expected
    assert await members(backend, tenant, "big", page=7) == expected
    assert await members(backend, tenant, "big", 3, page=333) == everyone  # before the removal
    one = await m.members_at(tenant, "big", None, "", 1)
    assert one.members == (everyone[0],) and one.next_after
    tail = await m.members_at(tenant, "big", None, everyone[-2], 10)
    assert tail.members == (everyone[-1],) and tail.next_after == ""
    past = await m.members_at(tenant, "big", None, "zzz", 10)
    assert past.members == () and past.next_after == ""
    between = await m.members_at(tenant, "big", None, "user:00009~x0", 3)  # not itself a member
    # A page may come back short after many removals (a backend bounds what one call
    # examines), never wrong: what it holds is the next members in order.
    assert between.members and between.members == tuple(expected[10 : 10 + len(between.members)])


async def test_delivery_is_frozen_by_reference_and_never_replaced(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    req = send(tenant)
    c.faults.arm(FaultPoint.AFTER_PUT_RECORD)
    with pytest.raises(InjectedCrash):
        await c.commit_send(req)
    await backend.membership.add_members(tenant, "c1", ["carol"])
    await backend.membership.remove_members(tenant, "c1", ["bob"])
    loaded = await backend.store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress)
    assert loaded.intent.delivery == FrozenDeliveryInput.at_version(1)
    await c.resume(req.key, "c1")
    page = await backend.outbox.read("", 10_000)
    entries = [e for e in page.entries if e.tenant == tenant]
    assert [(e.recipients, e.membership_version) for e in entries] == [(None, 1)]
    assert await members(backend, tenant, "c1", entries[0].membership_version) == ["alice", "bob"]
    assert await members(backend, tenant, "c1") == ["alice", "carol"]


async def test_a_send_is_frozen_at_the_version_current_at_reserve_or_as_the_caller_froze_it(
    harness: Harness,
) -> None:
    """Whether admission is its own lookup or decided inside reserve (Redis,
    memory): ``commit_send`` freezes the version reserve saw, ``commit`` stores a
    caller-frozen delivery as given."""
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    await backend.membership.add_members(tenant, "c1", ["carol"])  # version 2
    c = committer(backend)
    served = await c.commit_send(send(tenant))
    request = send(tenant)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit(request, FrozenDeliveryInput.at_version(1), ReserveCandidate("m-given", 7))
    stored = await backend.store.load_commit(request.key, "c1")
    assert isinstance(stored, InProgress)
    assert stored.intent.delivery == FrozenDeliveryInput.at_version(1)
    given = await c.resume(request.key, "c1")
    page = await backend.outbox.read("", 10_000)
    versions = {e.message_id: e.membership_version for e in page.entries if e.tenant == tenant}
    assert versions == {served.message_id: 2, given.message_id: 1}


async def test_a_removed_member_can_no_longer_send_but_reads_its_own_time(
    harness: Harness,
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend)
    sent = send(tenant, sender="bob")
    ack = await c.commit_send(sent)
    await backend.membership.remove_members(tenant, "c1", ["bob"])
    with pytest.raises(NotAMember):
        await c.commit_send(send(tenant, sender="bob"))
    assert await c.commit_send(sent) == ack  # a retry of an admitted send still replays
    with pytest.raises(IdempotencyConflict):  # the key is another message's: ALREADY_EXISTS
        await c.commit_send(send(tenant, sender="bob", cmid=sent.cmid, content=text("other")))
    later = await c.commit_send(send(tenant, sender="alice"))
    gone = await c.history(HistoryQuery(tenant, "c1", "bob"))  # History's reading rule:
    assert [r.message_id for r in gone.records] == [ack.message_id]  # what it was a member for
    assert gone.hidden_seqs == (later.seq,)
    await backend.membership.add_members(tenant, "c1", ["bob"])
    page = await c.history(HistoryQuery(tenant, "c1", "bob"))
    assert [r.message_id for r in page.records] == [ack.message_id]  # not what came while out


async def test_release1_inline_recipients_still_commit_recover_and_list(
    harness: Harness,
) -> None:
    clock = ManualClock()
    backend = await harness.open(clock=clock)
    tenant = unique("t")
    await conversation(backend, tenant)
    c = committer(backend, clock)
    inline = FrozenDeliveryInput(("alice", "bob"), 1)
    req = send(tenant)
    c.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(InjectedCrash):
        await c.commit(req, inline, ReserveCandidate("01a20000-0000-7000-8000-000000000001", 5))
    loaded = await backend.store.load_commit(req.key, "c1")
    assert isinstance(loaded, InProgress) and loaded.intent.delivery == inline
    clock.advance(120_000)
    report = await c.recover_due(clock.now_ms() - 30_000, 100)
    assert (report.committed, report.failed) == (1, 0)
    page = await backend.outbox.read("", 10_000)
    entries = [e for e in page.entries if e.tenant == tenant]
    assert [(e.recipients, e.membership_version) for e in entries] == [(("alice", "bob"), 1)]


async def test_member_pages_of_every_size_list_everyone_once(harness: Harness) -> None:
    backend = await harness.open()
    tenant = unique("t")
    m = backend.membership
    everyone = ["u1", "u2", "u3", "u4", "u5"]
    assert await m.create_conversation(tenant, "c1", everyone) == MembershipInfo(tenant, "c1", 1, 5)
    assert await m.remove_members(tenant, "c1", ["u2"]) == MembershipInfo(tenant, "c1", 2, 4)
    assert await m.membership_info(tenant, "c1") == MembershipInfo(tenant, "c1", 2, 4)
    now = [u for u in everyone if u != "u2"]
    for page in range(1, len(everyone) + 2):
        assert await members(backend, tenant, "c1", page=page) == now, page
        assert await members(backend, tenant, "c1", 1, page=page) == everyone, page
    last = await m.members_at(tenant, "c1", None, "u4", 10)
    assert (last.members, last.version, last.next_after) == (("u5",), 2, "")
    old = await m.members_at(tenant, "c1", 1, "u3", 1)
    assert (old.members, old.version) == (("u4",), 1)


async def test_a_users_intervals_are_one_point_lookup(harness: Harness) -> None:
    """What a conversation lane's reader is judged by (``mailbox.readable``)."""
    m = (await harness.open()).membership
    tenant = unique("t")
    await m.create_conversation(tenant, "c1", ["u1", "u2"])
    await m.add_members(tenant, "c1", ["u3"])  # v2
    await m.remove_members(tenant, "c1", ["u3"])  # v3
    await m.add_members(tenant, "c1", ["u3"])  # v4
    await m.remove_members(tenant, "c1", ["u2"])  # v5
    assert await m.member_intervals(tenant, "c1", "u1") == (1,)
    assert await m.member_intervals(tenant, "c1", "u2") == (1, 5)
    assert await m.member_intervals(tenant, "c1", "u3") == (2, 3, 4)
    assert await m.member_intervals(tenant, "c1", "never") == ()
    assert await m.member_intervals(tenant, "nope", "u1") is None


async def test_a_conversation_that_shrank_lists_its_members_in_one_call(
    harness: Harness,
) -> None:
    """20,000 users came and went, 5 stayed: the current version is one call, whatever
    passed through (issue 23, item 5); an older version still lists exactly its members."""
    backend = await harness.open()
    tenant = unique("t")
    m = backend.membership
    kept = [f"z-kept-{n}" for n in range(5)]  # sorted after every user who left
    await m.create_conversation(tenant, "shrunk", kept)
    waves = [[f"u{wave}-{n:05d}" for n in range(10_000)] for wave in range(2)]
    joined, left = [], []  # a backend may split a big change into several versions
    for users in waves:
        joined.append((await m.add_members(tenant, "shrunk", users)).version)
        left.append((await m.remove_members(tenant, "shrunk", users)).version)
    now = await m.members_at(tenant, "shrunk", None, "", 1000)
    assert (now.members, now.version, now.next_after) == (tuple(kept), left[1], "")
    assert await members(backend, tenant, "shrunk", joined[1], page=1000) == waves[1] + kept
    assert await members(backend, tenant, "shrunk", left[0], page=1000) == kept
    first = await members(backend, tenant, "shrunk", joined[0], page=777)
    assert first == waves[0] + kept


async def test_pages_of_an_older_version_merge_current_and_removed_users_in_id_order(
    harness: Harness,
) -> None:
    backend = await harness.open()
    tenant = unique("t")
    m = backend.membership
    users = [f"u{n:02d}" for n in range(30)]
    await m.create_conversation(tenant, "c1", users[::2])  # v1: the even ones
    await m.remove_members(tenant, "c1", users[0:10:2])  # v2
    await m.add_members(tenant, "c1", users[1::2])  # v3: the odd ones join
    await m.add_members(tenant, "c1", users[0:4:2])  # v4: two come back
    await m.remove_members(tenant, "c1", [users[0], users[12], users[13]])  # v5
    expected = {
        1: users[::2],
        2: users[10::2],
        3: users[10:] + users[1:10:2],
        4: users[10:] + users[1:10:2] + users[0:4:2],
    }
    expected[5] = [u for u in expected[4] if u not in (users[0], users[12], users[13])]
    for version, want in expected.items():
        for page in (1, 2, 3, 7, 100):
            got = await members(backend, tenant, "c1", version, page=page)
            assert got == sorted(want), (version, page)
