"""The relay section (DESIGN §10, seed 004), unchanged on every backend: fan-out to the
frozen recipients exactly once and in order, big conversations, leases and fencing
tokens, reconciliation, retries, dead letters, illegal transitions, fault points."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import replace

import pytest

from backends.memory.outbox_log import partition_of
from service.dead_letters import requeue_letters
from service.domain.committer import MessageCommitter
from service.domain.delivery import DeliverySettings, MailboxSettings
from service.domain.errors import IllegalTransition, LeaseLost, StoreUnavailable
from service.domain.faults import FaultPoint, FaultPoints, InjectedCrash, RelayPoint
from service.domain.mailbox import Mailbox, MailboxCursor, refusal_margin_ms
from service.domain.model import FrozenDeliveryInput, ReserveCandidate
from service.domain.ports import Backend, ManualClock
from service.domain.relay import DeadLetter, RelayPolicy, Settlement, Verdict
from service.domain.relay_worker import PartitionWork
from service.domain.targets import Targets
from service.relay_metrics import RelayMetrics
from service.relay_runner import RelayRunner
from tests.conformance.harness import Harness
from tests.conformance.relay_support import (
    POLICY,
    CountingMembership,
    FlakyMailbox,
    HookedPartitions,
    LaggingRecords,
    Seen,
    drain,
    inbox,
    ports,
    step_like_the_runner,
    with_mailbox,
)
from tests.support import committer, send, unique


async def _setup(harness: Harness) -> tuple[Backend, ManualClock, str]:
    clock = ManualClock()
    return await harness.open(clock=clock), clock, unique("t")


def box(tenant: str, user: str) -> Mailbox:
    return Mailbox.inbox(tenant, user)


async def test_every_message_reaches_every_frozen_recipient_once_in_seq_order(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    m = backend.membership
    await m.create_conversation(tenant, "c1", ["alice", "bob", "carol"])
    await m.create_conversation(tenant, "c2", ["bob", "dave"])
    for n in range(5):
        await c.commit_send(send(tenant, "c1", sender="alice", cmid=f"a{n}"))
        if n < 3:
            await c.commit_send(send(tenant, "c2", sender="dave", cmid=f"d{n}"))
    await m.add_members(tenant, "c1", ["erin"])
    for n in range(5, 7):
        await c.commit_send(send(tenant, "c1", sender="erin", cmid=f"e{n}"))
    await m.remove_members(tenant, "c1", ["carol"])
    await c.commit_send(send(tenant, "c1", sender="bob", cmid="b7"))
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen)
    c1 = [("c1", s) for s in range(1, 9)]
    c2 = [("c2", s) for s in range(1, 4)]
    assert await inbox(backend, box(tenant, "alice")) == c1
    assert sorted(await inbox(backend, box(tenant, "bob"))) == sorted(c1 + c2)
    assert [e for e in await inbox(backend, box(tenant, "bob")) if e[0] == "c1"] == c1
    assert await inbox(backend, box(tenant, "carol")) == c1[:7]  # removed before seq 8
    assert await inbox(backend, box(tenant, "erin")) == c1[5:]  # added before seq 6
    assert await inbox(backend, box(tenant, "dave")) == c2
    assert (seen.delivered, seen.added, seen.duplicates) == (11, 8 * 3 + 3 * 3 - 1, 0)
    for partition, lease in (await drain(backend, "relay-a", clock)).items():
        assert await ports(backend).partitions.oldest_pending_ms(lease) is None, partition


async def test_a_republished_entry_is_delivered_once(harness: Harness) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    c.faults.arm(FaultPoint.OUTBOX_SENT_UNACKED)  # published, but the ack was lost
    request = send(tenant, "c1", cmid="dup")
    with pytest.raises(InjectedCrash):
        await c.commit_send(request)
    await c.commit_send(request)  # publishes again: at least once
    page = await backend.outbox.read("", 100)
    assert sum(1 for e in page.entries if e.tenant == tenant) == 2
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen)
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]
    assert await inbox(backend, box(tenant, "alice")) == [("c1", 1)]
    assert seen.duplicates == 2 and seen.delivered == 2


async def test_big_conversations_get_one_lane_of_their_own_and_keep_it(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    policy = RelayPolicy(fanout_threshold=3, lease_ms=10_000)
    await backend.membership.create_conversation(tenant, "big", ["u1", "u2", "u3", "u4"])
    await backend.membership.create_conversation(tenant, "small", ["u1", "u2"])
    for n in range(3):
        await c.commit_send(send(tenant, "big", sender="u1", cmid=f"b{n}"))
    await c.commit_send(send(tenant, "small", sender="u1", cmid="s0"))
    await drain(backend, "relay-a", clock, policy=policy)
    lane = Mailbox.conversation(tenant, "big")
    assert await inbox(backend, lane) == [("big", 1), ("big", 2), ("big", 3)]
    assert await inbox(backend, box(tenant, "u3")) == []
    assert await inbox(backend, box(tenant, "u1")) == [("small", 1)]
    await backend.membership.remove_members(tenant, "big", ["u3", "u4"])  # now 2 <= 3
    await c.commit_send(send(tenant, "big", sender="u1", cmid="b3"))
    await drain(backend, "relay-a", clock, policy=policy)
    assert (await inbox(backend, lane))[-1] == ("big", 4)  # sticky: still its own lane
    assert await inbox(backend, box(tenant, "u2")) == [("small", 1)]


async def test_release_1_inline_recipients_are_delivered_as_frozen(harness: Harness) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    frozen = FrozenDeliveryInput(("bob", "zoe"), 1)
    await c.commit(
        send(tenant, "c1", cmid="old"), frozen, ReserveCandidate("m-old-1", clock.now_ms())
    )
    await drain(backend, "relay-a", clock)
    assert await inbox(backend, box(tenant, "zoe")) == [("c1", 1)]
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]
    assert await inbox(backend, box(tenant, "alice")) == []


async def test_a_lease_is_exclusive_until_it_expires_and_then_the_token_moves_on(
    harness: Harness,
) -> None:
    backend, clock, _ = await _setup(harness)
    parts = ports(backend).partitions
    partition = parts.partitions()[0]
    a = await parts.acquire(partition, "relay-a", 10_000)
    assert a is not None and a.taken_over
    assert await parts.acquire(partition, "relay-b", 10_000) is None
    renewed = await parts.acquire(partition, "relay-a", 10_000)
    assert renewed is not None and renewed.token == a.token and not renewed.taken_over
    clock.advance(10_001)
    b = await parts.acquire(partition, "relay-b", 10_000)
    assert b is not None and b.token == a.token + 1 and b.taken_over
    for call in (parts.claim(a, 10), parts.unsettled(a, 10), parts.settle(a, Settlement())):
        with pytest.raises(LeaseLost):
            await call
    await parts.release(a)  # not the latest: changes nothing
    assert await parts.acquire(partition, "relay-a", 10_000) is None
    await parts.release(b)
    again = await parts.acquire(partition, "relay-a", 10_000)
    assert again is not None and again.token == b.token + 1


async def test_a_deposed_relay_cannot_record_a_result(harness: Harness) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    for n in range(3):
        await c.commit_send(send(tenant, "c1", cmid=f"m{n}"))
    d = ports(backend)
    partition = await _busy_partition(backend)
    old = await d.partitions.acquire(partition, "relay-a", 10_000)
    assert old is not None
    claimed = await d.partitions.claim(old, 10)
    assert len(claimed) == 3  # relay A stalls here (a GC pause, a partition)
    clock.advance(10_001)
    seen = Seen()
    await drain(backend, "relay-b", clock, seen=seen)  # reconciles A's entries first
    assert seen.verdicts[Verdict.REJECTED] == 3
    with pytest.raises(LeaseLost):
        await d.partitions.settle(old, Settlement(sent=tuple(h.position for h in claimed)))
    targets = Targets(d, backend.membership, 1000)
    stale = PartitionWork(old, d, targets, policy=POLICY, clock=clock)
    stale.reconciling = False
    with pytest.raises(LeaseLost):
        await stale.step()
    from service.domain.delivery import AppendRequest
    from service.domain.mailbox import MailboxItem

    records = await d.records.records(tenant, "c1", [1])
    (outcome,) = await d.mailbox.append(
        [AppendRequest(box(tenant, "bob"), (MailboxItem(records[1]),))], old.fence
    )
    assert outcome.fenced  # B wrote to bob with a newer token: A's write is refused
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1), ("c1", 2), ("c1", 3)]


async def _busy_partition(backend: Backend) -> str:
    """The one partition with entries to deliver (the test committed to one conversation)."""
    d = ports(backend)
    busy = []
    for partition in d.partitions.partitions():
        lease = await d.partitions.acquire(partition, "probe", 1000)
        assert lease is not None
        if await d.partitions.oldest_pending_ms(lease) is not None:
            busy.append(partition)
        await d.partitions.release(lease)
    (only,) = busy
    return only


@pytest.mark.parametrize("point", list(RelayPoint))
async def test_a_crash_at_any_relay_point_converges_exactly_once(
    harness: Harness, point: RelayPoint
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob", "carol"])
    await backend.membership.create_conversation(tenant, "c2", ["bob", "dave"])
    for n in range(4):
        await c.commit_send(send(tenant, "c1", cmid=f"a{n}"))
        await c.commit_send(send(tenant, "c2", sender="dave", cmid=f"d{n}"))
    faults = FaultPoints()
    faults.arm(point)
    delivery = None
    if point is RelayPoint.AFTER_RETRY_MARK:  # reached only after a failed write
        dave = frozenset({box(tenant, "dave")})  # dave's inbox is down: c2's entries fail
        delivery = with_mailbox(backend, FlakyMailbox(ports(backend).mailbox, down=dave))
    with pytest.raises(InjectedCrash):
        await drain(backend, "relay-a", clock, faults=faults, delivery=delivery)
    assert faults.fired[point] == 1
    clock.advance(POLICY.lease_ms + 1)
    seen = Seen()
    await drain(backend, "relay-b", clock, seen=seen)
    c1 = [("c1", s) for s in range(1, 5)]
    c2 = [("c2", s) for s in range(1, 5)]
    for user, expected in (("alice", c1), ("carol", c1), ("dave", c2)):
        assert await inbox(backend, box(tenant, user)) == expected, (point, user)
    bob = await inbox(backend, box(tenant, "bob"))
    assert sorted(bob) == sorted(c1 + c2) and len(set(bob)) == 8, point
    if point is RelayPoint.AFTER_FANOUT:  # every write of A's batch happened: B confirms it
        # (a backend that keeps no durable "sending" list, Scylla, also reconciles
        # entries nobody had claimed yet: those are rejected, and written)
        assert seen.verdicts[Verdict.ACCEPTED] > 0
    if point in (RelayPoint.AFTER_CLAIM, RelayPoint.MID_FANOUT):  # B writes what is missing
        assert seen.verdicts[Verdict.REJECTED] > 0


async def test_failed_writes_are_retried_with_backoff_then_dead_lettered(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    await c.commit_send(send(tenant, "c1", cmid="m0"))
    # two attempts fail, each for both mailboxes (one call each: the halves of the fan-out)
    flaky = FlakyMailbox(ports(backend).mailbox, fail_appends=4)
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen, delivery=with_mailbox(backend, flaky))
    assert seen.retried == 2 and seen.dead == 0  # two retry marks, then delivered
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]
    await c.commit_send(send(tenant, "c1", cmid="m1"))
    hopeless = FlakyMailbox(ports(backend).mailbox, fail_appends=100)
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen, delivery=with_mailbox(backend, hopeless))
    assert (seen.retried, seen.dead) == (POLICY.max_attempts - 1, 1)
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]
    letters = []
    for partition in ports(backend).partitions.partitions():
        found, _ = await ports(backend).partitions.dead_letters(partition, "", 100)
        letters += [d for d in found if d.entry.tenant == tenant]
    assert len(letters) == 1
    (letter,) = letters
    assert (letter.entry.conversation, letter.entry.seq, letter.attempts) == (
        "c1",
        2,
        POLICY.max_attempts,
    )
    assert "StoreUnavailable" in letter.problem
    await drain(backend, "relay-a", clock)  # a dead letter is never picked up again
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]
    parts = ports(backend).partitions
    partition = ""
    for name in parts.partitions():
        if (await parts.dead_letters(name, "", 100))[0]:
            partition = name
    assert await parts.requeue(partition, [letter.letter, "no-such-letter"]) == 1
    assert (await parts.dead_letters(partition, "", 100))[0] == []
    await drain(backend, "relay-a", clock)  # the operator fixed the cause: delivered now
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1), ("c1", 2)]


async def test_one_mailboxs_outage_charges_only_the_entries_addressed_to_it(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    m = backend.membership
    await m.create_conversation(tenant, "c1", ["carol", "erin"])
    for n in range(2):
        await c.commit_send(send(tenant, "c1", sender="carol", cmid=f"before-{n}"))
    await m.add_members(tenant, "c1", ["dave"])
    for n in range(2):
        await c.commit_send(send(tenant, "c1", sender="carol", cmid=f"after-{n}"))
    dave = box(tenant, "dave")
    down = FlakyMailbox(ports(backend).mailbox, down=frozenset({dave}))
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen, delivery=with_mailbox(backend, down))
    every = [("c1", s) for s in range(1, 5)]
    for user in ("carol", "erin"):  # never held back by dave's inbox
        assert await inbox(backend, box(tenant, user)) == every, user
    assert await inbox(backend, dave) == []
    # only the two entries addressed to dave were charged, each max_attempts times
    assert (seen.retried, seen.dead) == (2 * (POLICY.max_attempts - 1), 2)
    parts = ports(backend).partitions
    letters: dict[str, tuple[str, DeadLetter]] = {}
    for partition in parts.partitions():
        found, _ = await parts.dead_letters(partition, "", 100)
        letters |= {d.letter: (partition, d) for d in found if d.entry.tenant == tenant}
    assert sorted(d.entry.seq for _, d in letters.values()) == [3, 4]
    for partition, letter in letters.values():  # the outage is over: requeued, delivered
        assert await parts.requeue(partition, [letter.letter]) == 1
    await drain(backend, "relay-a", clock)
    assert await inbox(backend, dave) == every[2:]
    assert await inbox(backend, box(tenant, "carol")) == every  # deduped


async def test_a_failed_settle_of_entries_waiting_for_a_mailbox_leaves_them_to_reconcile(
    harness: Harness,
) -> None:
    """Entries wait for bob's sick inbox; when it is due they are tried again and the
    settle does not answer (a StoreError out of the step, as the runner sees it).
    The next steps reconcile them, in order: never moved twice (IllegalTransition)."""
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    for n in range(2):
        await c.commit_send(send(tenant, "c1", sender="alice", cmid=f"m{n}"))
    bob = box(tenant, "bob")
    flaky = FlakyMailbox(ports(backend).mailbox, down=frozenset({bob}))
    armed: list[str] = []

    def before(call: str) -> None:
        if call in armed:
            armed.remove(call)
            raise StoreUnavailable("injected: the outbox did not answer")

    parts = HookedPartitions(ports(backend).partitions, before)
    delivery = replace(with_mailbox(backend, flaky), partitions=parts)
    targets = Targets(delivery, backend.membership, POLICY.fanout_threshold)
    waited = []
    for partition in parts.partitions():
        lease = await parts.acquire(partition, "relay-a", POLICY.lease_ms)
        assert lease is not None
        work = PartitionWork(lease, delivery, targets, policy=POLICY, clock=clock)
        for _ in range(10):  # reconcile (nothing), claim: bob's entries wait for his inbox
            result = await work.step()
            if not result.worked:
                break
        if not result.wait_ms:
            continue
        waited.append(partition)
        flaky.down = frozenset()
        clock.advance(result.wait_ms)
        armed.append("settle")
        with pytest.raises(StoreUnavailable):
            await work.step()  # tried again: written, then the settle failed
        await step_like_the_runner(work, clock)
    assert len(waited) == 1
    every = [("c1", 1), ("c1", 2)]
    assert await inbox(backend, bob) == every
    assert await inbox(backend, box(tenant, "alice")) == every


@pytest.mark.memory
async def test_another_tenants_entries_in_the_batch_are_neither_charged_nor_dead_lettered(
    memory_harness: Harness,
) -> None:
    backend, clock, _ = await _setup(memory_harness)
    c = committer(backend, clock)
    ta, tb = unique("ta"), unique("tb")
    home = partition_of(ta, "c1")
    other = next(f"k{n}" for n in range(1000) if partition_of(tb, f"k{n}") == home)
    await backend.membership.create_conversation(ta, "c1", ["alice", "bob"])
    await backend.membership.create_conversation(tb, other, ["carol", "dave"])
    for n in range(3):  # one partition, one batch: ta's and tb's entries interleaved
        await c.commit_send(send(ta, "c1", cmid=f"a{n}"))
        await c.commit_send(send(tb, other, sender="carol", cmid=f"b{n}"))
    down = FlakyMailbox(ports(backend).mailbox, down=frozenset({box(ta, "bob")}))
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen, delivery=with_mailbox(backend, down))
    for user in ("carol", "dave"):
        assert await inbox(backend, box(tb, user)) == [(other, s) for s in (1, 2, 3)]
    letters, _ = await ports(backend).partitions.dead_letters(home, "", 100)
    assert {d.entry.tenant for d in letters} == {ta} and len(letters) == 3
    assert (seen.retried, seen.dead) == (3 * (POLICY.max_attempts - 1), 3)


async def test_a_conversation_that_shrank_is_listed_in_a_few_calls_once_per_version(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    m = backend.membership
    policy = RelayPolicy(fanout_threshold=3, lease_ms=10_000)
    await m.create_conversation(tenant, "shrunk", ["alice", "bob"])
    for page in range(8):  # 8,000 users came and went; never more than 1,002 at once
        users = [f"g{page}-{n:04d}" for n in range(1000)]
        await m.add_members(tenant, "shrunk", users)
        await m.remove_members(tenant, "shrunk", users)
    for n in range(3):
        await c.commit_send(send(tenant, "shrunk", cmid=f"s{n}"))
    counting = CountingMembership(m)
    await drain(backend, "relay-a", clock, policy=policy, membership=counting)
    for user in ("alice", "bob"):
        assert await inbox(backend, box(tenant, user)) == [("shrunk", s) for s in (1, 2, 3)]
    # one listing for the three entries (one version), of one call: the users who left
    # before the version are never read (on main: 3 calls on Redis and Scylla)
    assert counting.listings["shrunk"] == 1, counting.listings


async def test_a_big_conversation_that_shrank_keeps_its_lane_without_a_listing(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    m = backend.membership
    policy = RelayPolicy(fanout_threshold=3, lease_ms=10_000)
    await m.create_conversation(tenant, "big", ["u1", "u2", "u3", "u4", "u5"])
    await c.commit_send(send(tenant, "big", sender="u1", cmid="b0"))
    await drain(backend, "relay-a", clock, policy=policy)
    await m.remove_members(tenant, "big", ["u3", "u4", "u5"])
    for n in range(1, 4):
        await c.commit_send(send(tenant, "big", sender="u1", cmid=f"b{n}"))
    counting = CountingMembership(m)
    await drain(backend, "relay-a", clock, policy=policy, membership=counting)
    lane = Mailbox.conversation(tenant, "big")
    assert await inbox(backend, lane) == [("big", s) for s in (1, 2, 3, 4)]
    assert counting.listings["big"] == 0  # the lane exists: no member is listed


async def _late_entry_of_an_older_version(
    harness: Harness,
) -> tuple[Backend, ManualClock, str, MessageCommitter, str]:
    """A 3-member conversation (threshold 3) whose message 1 went to the inboxes
    (version 1), whose message 2 (version 1) is committed but not yet published, and
    which has grown to 4 members (version 2)."""
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    m = backend.membership
    await m.create_conversation(tenant, "edge", ["u1", "u2", "u3"])
    await c.commit_send(send(tenant, "edge", sender="u1", cmid="e1"))
    late = send(tenant, "edge", sender="u1", cmid="e2")
    c.faults.arm(FaultPoint.AFTER_PUT_RECORD)
    with pytest.raises(InjectedCrash):
        await c.commit_send(late)
    return backend, clock, tenant, c, late.key.cmid


async def test_a_version_decided_for_the_inboxes_follows_the_lane_once_it_exists(
    harness: Harness,
) -> None:
    """Issue 23, item 9: version 1 went to the inboxes and was cached; version 2 crossed
    the threshold and made the lane; message 2, frozen at version 1 but published after
    message 3, went to the inboxes from the cache: the conversation was split."""
    backend, clock, tenant, c, late = await _late_entry_of_an_older_version(harness)
    policy = RelayPolicy(fanout_threshold=3, lease_ms=10_000)
    targets = Targets(ports(backend), backend.membership, policy.fanout_threshold)
    await drain(backend, "relay-a", clock, policy=policy, targets=targets)
    await backend.membership.add_members(tenant, "edge", ["u4"])
    await c.commit_send(send(tenant, "edge", sender="u1", cmid="e3"))
    await drain(backend, "relay-a", clock, policy=policy, targets=targets)
    await c.resume(send(tenant, "edge", sender="u1", cmid=late).key, "edge")
    await drain(backend, "relay-a", clock, policy=policy, targets=targets)
    lane = Mailbox.conversation(tenant, "edge")
    assert await inbox(backend, box(tenant, "u2")) == [("edge", 1)]
    assert await inbox(backend, lane) == [("edge", 3), ("edge", 2)]


async def test_a_relay_that_holds_a_partition_again_sees_the_lane_another_relay_made(
    harness: Harness,
) -> None:
    """The same split across relays: relay A cached version 1 for the inboxes, relay B
    made the lane while A did not hold the partition, and A then delivered version 1's
    late message to the inboxes."""
    backend, clock, tenant, c, late = await _late_entry_of_an_older_version(harness)
    policy = RelayPolicy(fanout_threshold=3, lease_ms=10_000)
    a = Targets(ports(backend), backend.membership, policy.fanout_threshold)
    await drain(backend, "relay-a", clock, policy=policy, targets=a)
    clock.advance(policy.lease_ms + 1)
    await backend.membership.add_members(tenant, "edge", ["u4"])
    await c.commit_send(send(tenant, "edge", sender="u1", cmid="e3"))
    await drain(backend, "relay-b", clock, policy=policy)
    clock.advance(policy.lease_ms + 1)
    await c.resume(send(tenant, "edge", sender="u1", cmid=late).key, "edge")
    await drain(backend, "relay-a", clock, policy=policy, targets=a)
    lane = Mailbox.conversation(tenant, "edge")
    assert await inbox(backend, box(tenant, "u2")) == [("edge", 1)]
    assert await inbox(backend, lane) == [("edge", 3), ("edge", 2)]


async def test_a_membership_that_cannot_be_listed_is_walked_once_not_per_entry(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    for n in range(3):
        await c.commit_send(send(tenant, "c1", cmid=f"m{n}"))
    counting = CountingMembership(backend.membership, refuse=frozenset({"c1"}))
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen, membership=counting)
    assert seen.dead == 3 and seen.retried == 0
    assert counting.listings["c1"] == 1


@pytest.mark.memory
async def test_one_mailboxs_outage_does_not_hold_back_the_rest_of_its_partition(
    memory_harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(memory_harness)
    c = committer(backend, clock)
    home = partition_of(tenant, "down")
    other = next(f"k{n}" for n in range(1000) if partition_of(tenant, f"k{n}") == home)
    await backend.membership.create_conversation(tenant, "down", ["alice", "dave"])
    await backend.membership.create_conversation(tenant, other, ["carol", "erin"])
    await c.commit_send(send(tenant, "down", cmid="d0"))
    for n in range(6):
        await c.commit_send(send(tenant, other, sender="carol", cmid=f"k{n}"))
    await c.commit_send(send(tenant, "down", cmid="d1"))  # waits behind d0 for dave: in order
    policy = RelayPolicy(batch=2, lease_ms=60_000, fanout_threshold=1000, max_attempts=4)
    flaky = FlakyMailbox(ports(backend).mailbox, down=frozenset({box(tenant, "dave")}))
    d = with_mailbox(backend, flaky)
    lease = await d.partitions.acquire(home, "relay-a", policy.lease_ms)
    assert lease is not None
    seen = Seen()
    work = PartitionWork(
        lease, d, Targets(d, backend.membership, 1000), policy=policy, clock=clock, observer=seen
    )
    for _ in range(50):  # the clock stands still: no backoff passes
        result = await work.step()
        if not result.worked and not work.reconciling:
            break
    assert result.wait_ms > 0  # only dave's entries wait
    for user in ("carol", "erin"):
        assert await inbox(backend, box(tenant, user)) == [(other, s) for s in range(1, 7)]
    assert await inbox(backend, box(tenant, "alice")) == [("down", 1)]
    assert await inbox(backend, box(tenant, "dave")) == []
    assert seen.retried == 1 and seen.dead == 0  # d0 was tried; d1 waits untried
    flaky.down = frozenset()  # dave's mailbox is back
    for _ in range(50):
        result = await work.step()
        if result.wait_ms:
            clock.advance(result.wait_ms)
        elif not result.worked and not work.reconciling:
            break
    assert await inbox(backend, box(tenant, "dave")) == [("down", 1), ("down", 2)]
    assert await inbox(backend, box(tenant, "alice")) == [("down", 1), ("down", 2)]
    assert await ports(backend).partitions.oldest_pending_ms(work.lease) is None


async def test_an_unknown_reconciliation_is_never_taken_for_success(harness: Harness) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    await c.commit_send(send(tenant, "c1", cmid="m0"))
    faults = FaultPoints()
    faults.arm(RelayPoint.AFTER_FANOUT)
    with pytest.raises(InjectedCrash):
        await drain(backend, "relay-a", clock, faults=faults)
    clock.advance(POLICY.lease_ms + 1)
    blind = FlakyMailbox(ports(backend).mailbox, fail_checks=3)  # both, then each alone
    seen = Seen()
    await drain(backend, "relay-b", clock, seen=seen, delivery=with_mailbox(backend, blind))
    assert seen.verdicts[Verdict.UNKNOWN] == 1 and seen.retried == 1
    assert seen.verdicts[Verdict.ACCEPTED] == 1  # checked again later, then confirmed
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]


async def test_an_undeliverable_entry_is_dead_lettered_at_once(harness: Harness) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    never = FrozenDeliveryInput.at_version(99)  # a version the conversation never had
    await c.commit(send(tenant, "c1", cmid="bad"), never, ReserveCandidate("m-bad-1", 1))
    await c.commit_send(send(tenant, "c1", cmid="good"))
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen)
    assert seen.dead == 1 and seen.retried == 0
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 2)]


async def test_a_record_history_does_not_show_yet_is_retried_not_dead_lettered(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    await c.commit_send(send(tenant, "c1", cmid="m0"))
    lagging = replace(ports(backend), records=LaggingRecords(ports(backend).records, hide=2))
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen, delivery=lagging)
    assert (seen.dead, seen.retried) == (0, 2)  # missed twice, then read and delivered
    assert await inbox(backend, box(tenant, "bob")) == [("c1", 1)]


async def test_settling_an_entry_that_is_not_sending_is_an_illegal_transition(
    harness: Harness,
) -> None:
    backend, clock, tenant = await _setup(harness)
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    await c.commit_send(send(tenant, "c1", cmid="m0"))
    await c.commit_send(send(tenant, "c1", cmid="m1"))
    d = ports(backend)
    partition = await _busy_partition(backend)
    lease = await d.partitions.acquire(partition, "relay-a", 10_000)
    assert lease is not None
    first = await d.partitions.claim(lease, 1)
    assert len(first) == 1
    pending = (await backend.outbox.read("", 100)).entries
    unclaimed = next(e for e in pending if e.tenant == tenant and e.seq == 2)
    with pytest.raises(IllegalTransition):  # pending -> sent skips sending
        await d.partitions.settle(lease, Settlement(sent=(unclaimed.publication.position,)))
    await d.partitions.settle(lease, Settlement(sent=(first[0].position,)))
    with pytest.raises(IllegalTransition):  # sent -> sent
        await d.partitions.settle(lease, Settlement(sent=(first[0].position,)))


async def test_relays_share_the_partitions_and_take_over_a_stopped_one(harness: Harness) -> None:
    backend = await harness.open()  # real time: the runners renew every lease / 3
    d = ports(backend)
    policy = RelayPolicy(lease_ms=1500)
    runners = [
        RelayRunner(backend, policy=policy, idle_wait_s=0.05, metrics=RelayMetrics())
        for _ in range(2)
    ]
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(r.run(s)) for r, s in zip(runners, stops, strict=True)]
    total = len(d.partitions.partitions())
    try:
        share = -(-total // 2)
        await _until(  # the first one may hold more until it sees the second announce itself
            lambda: (
                sum(len(r.held) for r in runners) == total
                and max(len(r.held) for r in runners) == share
            )
        )
        assert not set(runners[0].held) & set(runners[1].held)
        stops[0].set()  # a graceful stop releases every lease at once
        await tasks[0]
        await _until(lambda: len(runners[1].held) == total)
        owners = Counter(runners[1].lease(p).owner for p in runners[1].held)
        assert owners == {runners[1].owner: total}
    finally:
        for stop in stops:
            stop.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await task


async def _until(check: object, timeout_s: float = 15.0) -> None:
    assert callable(check)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def _lane(backend: Backend, mailbox: Mailbox) -> list[tuple[str, int]]:
    """(conversation, seq) of what a lane holds now, from its trim watermark."""
    d = ports(backend)
    (state,) = await d.mailbox.lane_state([mailbox])
    cursor = MailboxCursor(mailbox.lane, state.epoch, state.watermark)
    page = await d.mailbox.sync(mailbox, cursor, 1000, 1 << 20)
    return [(e.record.conversation, e.record.seq) for e in page.entries]


async def _dead_letters(backend: Backend, tenant: str) -> list[tuple[str, DeadLetter]]:
    parts = ports(backend).partitions
    found: list[tuple[str, DeadLetter]] = []
    for partition in parts.partitions():
        page, _ = await parts.dead_letters(partition, "", 100)
        found += [(partition, d) for d in page if d.entry.tenant == tenant]
    return found


async def _one_dead_letter_for_dave(
    harness: Harness, settings: MailboxSettings
) -> tuple[Backend, ManualClock, str, tuple[str, DeadLetter]]:
    """c1 (carol, dave) gets one message while dave's inbox is down: carol holds it,
    dave's entry is a dead letter (at the first failure: the clock stays, so a
    Scylla relay keeps its lease)."""
    clock = ManualClock()
    backend = await harness.open(clock=clock, delivery=DeliverySettings(mailbox=settings))
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c1", ["carol", "dave"])
    await committer(backend, clock).commit_send(send(tenant, "c1", sender="carol", cmid="m1"))
    down = FlakyMailbox(ports(backend).mailbox, down=frozenset({box(tenant, "dave")}))
    hopeless = replace(POLICY, max_attempts=1)
    await drain(backend, "relay-a", clock, delivery=with_mailbox(backend, down), policy=hopeless)
    (letter,) = await _dead_letters(backend, tenant)
    return backend, clock, tenant, letter


async def test_a_requeue_after_a_count_trim_does_not_append_a_message_twice(
    harness: Harness,
) -> None:
    """Issue 23, item 8: carol's lane trimmed m1 by count (and its dedupe id with
    it), so requeueing dave's dead letter appended m1 to carol's lane again."""
    settings = MailboxSettings(max_entries=2)
    backend, clock, tenant, (partition, letter) = await _one_dead_letter_for_dave(harness, settings)
    await backend.membership.create_conversation(tenant, "c2", ["carol", "erin"])
    c = committer(backend, clock)
    for n in range(3):
        await c.commit_send(send(tenant, "c2", sender="erin", cmid=f"x{n}"))
    await drain(backend, "relay-a", clock)
    carol = box(tenant, "carol")
    assert (await ports(backend).mailbox.lane_state([carol]))[0].watermark >= 1  # m1 trimmed
    assert await ports(backend).partitions.requeue(partition, [letter.letter]) == 1
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen)
    assert await inbox(backend, box(tenant, "dave")) == [("c1", 1)]
    assert await _lane(backend, carol) == [("c2", 1), ("c2", 2), ("c2", 3)]
    assert (seen.added, seen.duplicates, seen.too_old) == (1, 1, 0)


async def test_a_message_older_than_the_dedupe_window_is_refused_as_a_dead_letter(
    harness: Harness,
) -> None:
    """A requeue (or a relay) past the window could append a message a lane has
    forgotten: it becomes a dead letter again, with the reason, and nothing is
    written (``too_old_to_deliver``'s boundary is in tests/unit)."""
    window = 600_000
    settings = MailboxSettings(max_entries=2, dedupe_window_ms=window)
    backend, clock, tenant, (partition, letter) = await _one_dead_letter_for_dave(harness, settings)
    commit_ts = letter.entry.published_ms
    margin = refusal_margin_ms(window)
    clock.advance(max(0, commit_ts + window - margin - clock.now_ms()))
    assert await ports(backend).partitions.requeue(partition, [letter.letter]) == 1
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen)
    assert await inbox(backend, box(tenant, "dave")) == []
    assert await inbox(backend, box(tenant, "carol")) == [("c1", 1)]
    # Scylla's new lease holder (the clock passed the lease) also reconciles the
    # first entry again, still in its settle window: refused too
    assert seen.added == 0 and seen.too_old == seen.dead >= 1
    again = await _dead_letters(backend, tenant)
    assert {d.entry.message_id for _, d in again} == {letter.entry.message_id}
    assert all("older than the mailbox dedupe window" in d.problem for _, d in again)


async def test_requeue_leaves_a_letter_older_than_the_dedupe_window_and_says_so(
    harness: Harness,
) -> None:
    """``relay-dead-letters --requeue`` re-sends what the window covers and names, per
    letter, what it leaves (the relay would refuse it: it may be appended twice)."""
    window = 600_000
    settings = MailboxSettings(dedupe_window_ms=window)
    backend, clock, tenant, (partition, letter) = await _one_dead_letter_for_dave(harness, settings)
    d = ports(backend)
    e = letter.entry
    (record,) = (await d.records.records(e.tenant, e.conversation, [e.seq])).values()
    late = record.server_ts_ms + window - refusal_margin_ms(window)
    assert await requeue_letters(d, partition, [letter], late) == (0, [letter])
    assert [x.letter for _, x in await _dead_letters(backend, tenant)] == [letter.letter]
    assert await requeue_letters(d, partition, [letter], late - 1) == (1, [])
    await drain(backend, "relay-a", clock)
    assert await inbox(backend, box(tenant, "dave")) == [("c1", 1)]


async def test_a_republished_entry_after_a_count_trim_is_delivered_once(
    harness: Harness,
) -> None:
    """A publish retried after a lost reply reaches the relay after bob's inbox (at
    most 2 entries) trimmed the first copy: still deduped."""
    clock = ManualClock()
    settings = MailboxSettings(max_entries=2)
    backend = await harness.open(clock=clock, delivery=DeliverySettings(mailbox=settings))
    tenant = unique("t")
    c = committer(backend, clock)
    await backend.membership.create_conversation(tenant, "c1", ["alice", "bob"])
    c.faults.arm(FaultPoint.OUTBOX_SENT_UNACKED)  # published, but the ack was lost
    request = send(tenant, "c1", cmid="dup")
    with pytest.raises(InjectedCrash):
        await c.commit_send(request)
    await drain(backend, "relay-a", clock)
    for n in range(3):
        await c.commit_send(send(tenant, "c1", cmid=f"later-{n}"))
    await drain(backend, "relay-a", clock)
    bob = box(tenant, "bob")
    assert (await ports(backend).mailbox.lane_state([bob]))[0].watermark >= 1
    await c.commit_send(request)  # publishes the first message again
    seen = Seen()
    await drain(backend, "relay-a", clock, seen=seen)
    assert (seen.added, seen.duplicates) == (0, 2)
    assert ("c1", 1) not in await _lane(backend, bob)
