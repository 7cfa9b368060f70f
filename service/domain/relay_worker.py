"""PartitionWork: one relay's work on one leased outbox partition (DESIGN §10).

``step()`` does one durable step and says whether there was work:

1. right after a lease with a new token (``R-RELAY-01``), and after a batch
   that failed in a way whose targets are unknown, it reconciles: the oldest
   unsettled entries are read, each one's target mailboxes are asked whether
   they hold its message; accepted entries are confirmed, rejected ones
   written again, and when the check fails (unknown) nothing is confirmed;
2. when a mailbox that failed is due again, its waiting entries are tried
   again (``service.domain.relay_waiting``), reconciled first;
3. otherwise it claims the next batch (``R-RELAY-02``), resolves each entry's
   recipients from its frozen delivery and its record from history, writes
   each target mailbox's groups (``R-RELAY-03`` half-way, ``R-RELAY-04``
   after the last write) and only then settles the batch (``R-RELAY-06``
   after that).

Failures are charged per entry and per mailbox (``R-RELAY-05``): the entries
addressed to a mailbox whose append failed get a retry mark with a backoff
and wait for it, with any newer entry addressed to it (untried), while the
rest of the partition goes on; a failed history or membership read or check
charges its entries and pauses the partition until the first retry, and so
does a record history does not show (yet: a lagging replica). An entry that
can never be delivered (its conversation or membership version is gone,
history holds another message at its seq, its data is corrupt), or failed
``max_attempts`` times, is dead-lettered, and so is one whose message is older
than the mailbox dedupe window (``TOO_OLD``: a lane may have held it and forgotten
its id, so it is never appended again). A fenced write or a lost lease
ends the work at once: another relay holds the partition now. Everything
here is stdlib-only; the runner (``service.relay_runner``) owns the timing, the
leases and the tasks.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from service.domain.delivery import AppendRequest, DeliveryPorts
from service.domain.errors import (
    IllegalTransition,
    LeaseLost,
    StoreCorrupt,
    StoreError,
    StoreFenced,
    StoreInvalid,
    StoreNotFound,
)
from service.domain.faults import FaultPoints, RelayPoint
from service.domain.lane_marks import LaneMark, LaneMarks
from service.domain.mailbox import (
    UNKNOWN_VERSION,
    Mailbox,
    MailboxItem,
    OwnerKind,
    split_group,
    too_old_to_deliver,
)
from service.domain.model import MessageRecord
from service.domain.ports import Clock
from service.domain.relay import (
    DeadLetter,
    EntryState,
    Lease,
    PartitionEntry,
    RelayPolicy,
    RetryMark,
    Settlement,
    Tracker,
    Verdict,
    verdict,
)
from service.domain.relay_appends import Appends, LaneObserver
from service.domain.relay_waiting import Waiting
from service.domain.targets import Targets


class RelayObserver(LaneObserver, Protocol):
    """Receives what the relay did; the service layer turns it into metrics."""

    def on_delivered(
        self, entries: int, added: int, duplicates: int, ages_ms: list[int]
    ) -> None: ...
    def on_retried(self, entries: int) -> None: ...
    def on_dead_lettered(self, entries: int) -> None: ...
    def on_reconciled(self, result: Verdict, entries: int) -> None: ...
    def on_too_old(self, entries: int) -> None:
        """``entries`` were refused (dead-lettered) as older than the dedupe window."""


class NoObserver:
    def on_delivered(self, entries: int, added: int, duplicates: int, ages_ms: list[int]) -> None:
        pass

    def on_retried(self, entries: int) -> None:
        pass

    def on_dead_lettered(self, entries: int) -> None:
        pass

    def on_reconciled(self, result: Verdict, entries: int) -> None:
        pass

    def on_too_old(self, entries: int) -> None:
        pass

    def on_lane_moved_back(self, kind: str, seen: LaneMark, found: LaneMark, epoch: int) -> None:
        pass


TOO_OLD = (
    "older than the mailbox dedupe window: a mailbox may have held it and forgotten its id,"
    " so it is not appended again (it is in history)"
)
"""The problem of an entry refused by ``too_old_to_deliver``."""


class Undeliverable(Exception):
    """One entry can never be delivered (a reason for its dead letter)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one entry goes and what it carries."""

    held: PartitionEntry
    record: MessageRecord
    mailboxes: tuple[Mailbox, ...]

    @property
    def lane_version(self) -> int:
        """The membership version its mailbox entries carry (``mailbox.readable``):
        the version its delivery was frozen at; a release-1 entry's recipients were
        frozen inline, not as a version, so ``UNKNOWN_VERSION``."""
        entry = self.held.entry
        return UNKNOWN_VERSION if entry.recipients is not None else entry.membership_version


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step found: ``worked`` false means the partition had nothing to do;
    ``wait_ms`` asks the runner not to step again before then."""

    worked: bool
    wait_ms: int = 0


class PartitionWork:
    """The relay's state for one held partition; the runner calls ``step``."""

    def __init__(
        self,
        lease: Lease,
        ports: DeliveryPorts,
        targets: Targets,
        *,
        policy: RelayPolicy,
        clock: Clock,
        faults: FaultPoints | None = None,
        observer: RelayObserver | None = None,
        marks: LaneMarks | None = None,
    ) -> None:
        """``marks``: the lanes' high-water marks, shared by the relay's partitions."""
        self.lease = lease
        self._marks = marks if marks is not None else LaneMarks()
        self._ports = ports
        self._targets = targets
        self._policy = policy
        self._clock = clock
        self._faults = faults or FaultPoints()
        self._observer: RelayObserver = observer or NoObserver()
        self._tracker = Tracker()
        self.reconciling = True  # a relay never knows what an earlier holder left
        self._not_before = 0
        self._waiting = Waiting()
        if lease.taken_over:
            self._faults.check(RelayPoint.AFTER_TAKEOVER)

    def renewed(self, lease: Lease) -> None:
        """The runner renewed the lease (same token)."""
        if lease.token != self.lease.token:
            raise LeaseLost("the lease was renewed under another token")
        self.lease = lease

    async def step(self) -> StepResult:
        try:
            return await self._step()
        except (LeaseLost, StoreFenced, IllegalTransition):
            raise
        except StoreError:
            # A claim or settle that failed may have run (its outcome is unknown), and
            # what this relay held or waited for is unsettled in the partition either
            # way: the next step reconciles it all, oldest first, from the backend's
            # own states (a local state left at sending is never moved again).
            self._tracker = Tracker()
            self._waiting.clear()
            self.reconciling = True
            raise

    async def _step(self) -> StepResult:
        now = self._clock.now_ms()
        if now < self._not_before:
            return StepResult(False, self._not_before - now)
        partitions = self._ports.partitions
        batch = self._policy.batch
        if self.reconciling:  # what this relay is not waiting for itself
            held = await partitions.unsettled(self.lease, batch + len(self._waiting))
            held = [h for h in held if h.position not in self._waiting][:batch]
            if not held:
                self.reconciling = False
                return StepResult(True)
            for h in held:
                self._tracker.states[h.position] = (
                    EntryState.RETRYABLE if h.attempts else EntryState.SENDING
                )
            self._tracker.move([h.position for h in held if h.attempts], EntryState.SENDING)
            await self._run(held, reconcile=True)
            return StepResult(True)
        again = self._waiting.due(now, batch)
        if again:  # a sick mailbox is due: its waiting entries, before anything newer
            self._tracker.move([h.position for h in again], EntryState.SENDING)
            await self._run(again, reconcile=True, hold=False)
            return StepResult(True)
        held = await partitions.claim(self.lease, batch)
        if not held:
            return StepResult(False, self._waiting.next_due_ms(now))
        self._tracker.move([h.position for h in held], EntryState.SENDING)
        self._faults.check(RelayPoint.AFTER_CLAIM)
        await self._run(held, reconcile=False)
        return StepResult(True)

    # --- one batch -------------------------------------------------------------

    async def _run(self, held: list[PartitionEntry], *, reconcile: bool, hold: bool = True) -> None:
        """Deliver ``held``; a failure is charged to the entries it touched only: an
        entry whose conversation, check or target mailbox failed is retried (or
        dead-lettered after ``max_attempts``), the others of the batch are settled.
        With ``hold``, entries addressed to a sick mailbox wait for it untried.

        Entries whose mailboxes failed wait for them (``Waiting``) while the
        partition goes on; any other failure (history, membership, a check)
        pauses the partition until the first retry, as its targets are unknown."""
        try:
            plans, dead, failed = await self._prepare(held)
            if reconcile:
                plans, blind = await self._reconcile(plans)
                failed += blind
            plans = self._refuse_too_old(plans, dead)
            pause = bool(failed)
            back: list[tuple[Plan, int]] = []
            if hold:
                keep = []
                for plan in plans:
                    due = self._waiting.sick_due(plan.mailboxes)
                    if due is None:
                        keep.append(plan)
                    else:
                        back.append((plan, due))
                plans = keep
            added, duplicates, broken = await self._write(plans)
        except (LeaseLost, StoreFenced):
            raise
        except StoreError as exc:  # unavailable, or an unknown outcome: never success
            await self._finish(held, [], [(h, type(exc).__name__) for h in held], [], pause=True)
            self._waiting.clear()  # the reconciliation after the pause takes them all
            return
        charged: list[Plan] = []
        for plan in plans:
            problem = next((broken[m] for m in plan.mailboxes if m in broken), None)
            if problem is not None:
                failed.append((plan.held, problem))
                charged.append(plan)
        waits = [(p.held, due) for p, due in back]
        marks = await self._finish(held, dead, failed, waits, pause=pause)
        if pause:
            self._waiting.clear()  # the reconciliation after the pause takes them all
        else:
            for plan in charged:
                mark = marks.get(plan.held.position)
                if mark is not None:  # else dead-lettered
                    again = PartitionEntry(plan.held.entry, mark.attempts)
                    sick = [m for m in plan.mailboxes if m in broken]
                    self._waiting.add(again, plan.mailboxes, mark.due_ms, sick)
            for plan, due in back:
                self._waiting.add(plan.held, plan.mailboxes, due)
        had = len(self._waiting)
        self._waiting.forget(h.position for h in held if h.position not in marks)
        if had and not self._waiting:  # the outage is over: look at what is unsettled once
            self.reconciling = True
        now = self._clock.now_ms()
        waiting = {h.position for h, _ in failed} | {h.position for h, _ in waits}
        delivered = [p for p in plans if p.held.position not in waiting]
        ages = [now - p.held.entry.published_ms for p in delivered if p.held.entry.published_ms]
        sent = len(held) - len(dead) - len(waiting)
        self._observer.on_delivered(sent, added, duplicates, ages)

    async def _finish(
        self,
        held: list[PartitionEntry],
        dead: list[DeadLetter],
        failed: list[tuple[PartitionEntry, str]],
        waits: list[tuple[PartitionEntry, int]],
        *,
        pause: bool,
    ) -> dict[str, RetryMark]:
        """One settle: the failed entries charged an attempt, the waiting ones marked
        (not charged), the dead ones lettered, every other entry of ``held`` sent.
        Returns the retry marks by position; ``pause`` stops the partition until
        the first of them is due."""
        now = self._clock.now_ms()
        dead = list(dead)
        marks: list[RetryMark] = []
        for h, problem in failed:
            attempts = h.attempts + 1
            if attempts >= self._policy.max_attempts:
                dead.append(DeadLetter(h.entry, f"failed {attempts} times: {problem}", attempts))
            else:
                due = now + self._policy.retry_delay_ms(attempts)
                marks.append(RetryMark(h.position, attempts, due, problem))
        charged = len(marks)
        marks += [
            RetryMark(h.position, h.attempts, due, "waiting for a mailbox") for h, due in waits
        ]
        gone = {d.entry.publication.position for d in dead} | {m.position for m in marks}
        sent = tuple(h.position for h in held if h.position not in gone)
        await self._settle(Settlement(sent=sent, retry=tuple(marks), dead=tuple(dead)))
        if charged:
            self._observer.on_retried(charged)
        if dead:
            self._observer.on_dead_lettered(len(dead))
        if failed or waits:
            self._faults.check(RelayPoint.AFTER_RETRY_MARK)
        if pause and failed:
            self.reconciling = True
            self._not_before = min((m.due_ms for m in marks), default=now)
        return {m.position: m for m in marks}

    async def _prepare(
        self, held: list[PartitionEntry]
    ) -> tuple[list[Plan], list[DeadLetter], list[tuple[PartitionEntry, str]]]:
        """Each entry's record and target mailboxes; the undeliverable ones as dead
        letters; those whose history or membership read failed, with the error."""
        by_conversation: defaultdict[tuple[str, str], list[PartitionEntry]] = defaultdict(list)
        for h in held:
            by_conversation[(h.entry.tenant, h.entry.conversation)].append(h)
        plans: list[Plan] = []
        dead: list[DeadLetter] = []
        failed: list[tuple[PartitionEntry, str]] = []
        for (tenant, conversation), entries in by_conversation.items():
            try:
                records = await self._ports.records.records(
                    tenant, conversation, sorted({h.entry.seq for h in entries})
                )
            except (LeaseLost, StoreFenced):
                raise
            except StoreError as exc:
                failed += [(h, type(exc).__name__) for h in entries]
                continue
            for h in entries:
                record = records.get(h.entry.seq)
                if record is None:  # a replica not caught up yet, or trimmed: retried
                    failed.append((h, "the record is not in history (yet)"))
                    continue
                try:
                    plans.append(await self._plan(h, record))
                except (Undeliverable, StoreNotFound, StoreInvalid, StoreCorrupt) as exc:
                    problem = str(exc) if isinstance(exc, Undeliverable) else type(exc).__name__
                    dead.append(DeadLetter(h.entry, problem, h.attempts + 1))
                except (LeaseLost, StoreFenced):
                    raise
                except StoreError as exc:
                    failed.append((h, type(exc).__name__))
        return plans, dead, failed

    def _refuse_too_old(self, plans: list[Plan], dead: list[DeadLetter]) -> list[Plan]:
        """The plans still to write; those whose message the dedupe window no longer
        covers go to ``dead`` instead (a lane may have forgotten its id: an append
        could add it twice). Checked just before the write, so an entry every
        target already holds (reconciled as accepted) is confirmed, not refused."""
        window = self._ports.mailbox.settings.dedupe_ms
        now = self._clock.now_ms()
        keep: list[Plan] = []
        refused = 0
        for plan in plans:
            if too_old_to_deliver(plan.record.server_ts_ms, now_ms=now, window_ms=window):
                dead.append(DeadLetter(plan.held.entry, TOO_OLD, plan.held.attempts + 1))
                refused += 1
            else:
                keep.append(plan)
        if refused:
            self._observer.on_too_old(refused)
        return keep

    async def _plan(self, held: PartitionEntry, record: MessageRecord) -> Plan:
        entry = held.entry
        if record.message_id != entry.message_id:
            raise Undeliverable("history holds another message at this seq")
        return Plan(held, record, await self._targets.of(entry, self.lease.fence))

    async def _reconcile(
        self, plans: list[Plan]
    ) -> tuple[list[Plan], list[tuple[PartitionEntry, str]]]:
        """Which unsettled entries' writes all happened (confirmed) and which not
        (returned: to write again); those whose check failed for one of their
        mailboxes, with the error (unknown, never success)."""
        wanted: defaultdict[Mailbox, list[str]] = defaultdict(list)
        for plan in plans:
            for mailbox in plan.mailboxes:
                wanted[mailbox].append(plan.record.message_id)
        queries = [(m, tuple(ids)) for m, ids in wanted.items()]
        found, blind = await self._contains(queries)
        holding: defaultdict[str, set[Mailbox]] = defaultdict(set)
        for (mailbox, _), present in zip(queries, found, strict=True):
            for message_id in present:
                holding[message_id].add(mailbox)
        rejected: list[Plan] = []
        unknown: list[tuple[PartitionEntry, str]] = []
        for plan in plans:
            problem = next((blind[m] for m in plan.mailboxes if m in blind), None)
            if problem is not None:
                self._observer.on_reconciled(Verdict.UNKNOWN, 1)
                unknown.append((plan.held, problem))
                continue
            result = verdict(plan.mailboxes, holding.get(plan.record.message_id, set()))
            if result is Verdict.REJECTED:
                rejected.append(plan)
            else:
                self._observer.on_reconciled(result, 1)
        return await self._not_held_where_decided(rejected), unknown

    async def _not_held_where_decided(self, plans: list[Plan]) -> list[Plan]:
        """Of the entries the conversation lane lacks, those their own version did not
        send to the inboxes either: an entry delivered to the inboxes before its
        conversation got its lane (the lane is sticky) was delivered, not lost."""
        own: dict[int, tuple[Mailbox, ...]] = {}
        for n, plan in enumerate(plans):
            if plan.mailboxes[0].kind is OwnerKind.CONVERSATION:
                with contextlib.suppress(StoreError):
                    boxes = await self._targets.own(plan.held.entry)
                    if boxes and boxes != plan.mailboxes:
                        own[n] = boxes
        still = plans
        queries: list[tuple[Mailbox, tuple[str, ...]]] = [
            (m, (plans[n].record.message_id,)) for n, boxes in own.items() for m in boxes
        ]
        if queries:
            found, blind = await self._contains(queries)
            held = {(m, ids[0]) for (m, ids), got in zip(queries, found, strict=True) if got}
            still = [
                plan
                for n, plan in enumerate(plans)
                if n not in own
                or bool(blind)
                or any((m, plan.record.message_id) not in held for m in own[n])
            ]
        if len(still) < len(plans):
            self._observer.on_reconciled(Verdict.ACCEPTED, len(plans) - len(still))
        if still:
            self._observer.on_reconciled(Verdict.REJECTED, len(still))
        return still

    async def _contains(
        self, queries: list[tuple[Mailbox, tuple[str, ...]]]
    ) -> tuple[list[frozenset[str]], dict[Mailbox, str]]:
        """What each mailbox holds; when the call fails, each mailbox is asked alone
        so that only the failing ones are unknown (with the error)."""
        try:
            return await self._ports.mailbox.contains(queries), {}
        except StoreError as exc:
            if len(queries) <= 1:
                return [frozenset() for _ in queries], {m: type(exc).__name__ for m, _ in queries}
        found: list[frozenset[str]] = []
        blind: dict[Mailbox, str] = {}
        for query in queries:
            try:
                found += await self._ports.mailbox.contains([query])
            except StoreError as exc:
                found.append(frozenset())
                blind[query[0]] = type(exc).__name__
        return found, blind

    async def _write(self, plans: Sequence[Plan]) -> tuple[int, int, dict[Mailbox, str]]:
        """Each target mailbox's items, a conversation's messages in seq order, as
        groups of bounded size (``split_group``): round k holds every mailbox's
        k-th group, so a mailbox's groups are appended in order. Returns what was
        added, the duplicates, and the mailboxes whose append failed (with the
        error: nothing after a failed group is written to that mailbox)."""
        items: defaultdict[Mailbox, list[MailboxItem]] = defaultdict(list)
        for plan in sorted(plans, key=lambda p: (p.record.conversation, p.record.seq)):
            item = MailboxItem(plan.record, plan.lane_version)  # immutable: one per plan
            for mailbox in plan.mailboxes:
                items[mailbox].append(item)
        parts = {m: split_group(i) for m, i in items.items()}
        rounds = max((len(p) for p in parts.values()), default=0)
        requests = [
            AppendRequest(m, p[k]) for k in range(rounds) for m, p in parts.items() if k < len(p)
        ]
        half = len(requests) // 2
        broken: dict[Mailbox, str] = {}
        appends = Appends(self._ports.mailbox, self.lease.fence, self._marks, self._observer)
        outcomes = await appends.write(requests[:half], broken)
        self._faults.check(RelayPoint.MID_FANOUT)
        outcomes += await appends.write(requests[half:], broken)
        self._faults.check(RelayPoint.AFTER_FANOUT)
        return sum(o.added for o in outcomes), sum(o.duplicates for o in outcomes), broken

    async def _settle(self, settlement: Settlement) -> None:
        if settlement.empty:
            return
        tracker = Tracker(dict(self._tracker.states))  # check every move before any is made
        tracker.move(settlement.sent, EntryState.SENT)
        tracker.move([m.position for m in settlement.retry], EntryState.RETRYABLE)
        tracker.move(
            [d.entry.publication.position for d in settlement.dead], EntryState.DEAD_LETTER
        )
        await self._ports.partitions.settle(self.lease, settlement)
        self._tracker = tracker
        self._faults.check(RelayPoint.SETTLE_SENT_UNACKED)
