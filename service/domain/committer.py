"""MessageCommitter: drives one send to COMMITTED (DESIGN §5).

The only place a CommittedMessage (and so a SEND_ACK) comes from. It
validates and freezes everything before reserve, then walks the state
machine from whatever the durable state is; a lost response or another
worker's advance is answered by re-reading the store and going forward.

Admission is a point lookup at the current membership version and the
delivery is frozen by reference to that version (DESIGN §9), so a send costs
the same whatever the conversation's size. A store that can (Redis) decides
admission inside its reserve step (``admits_in_reserve``) and sends a fresh
intent's put_record, outbox append and commit mark together
(``pipelines_with``): the same steps and states, fewer round trips; an armed
fault point splits the pipeline where it falls. Recovery works the store's queue
(DESIGN §12): one bad intent is retried later or quarantined, never a reason
to stop.

Logging: INFO and WARNING lines name the step and the error class only; the
key (tenant, sender, cmid), which can name a person, is logged at DEBUG.
"""

from __future__ import annotations

import logging
import os
from asyncio import Event  # coordination of coroutines only; no I/O
from typing import Protocol

from service.domain.errors import (
    CommitAbandoned,
    CommitNotFound,
    ConversationNotFound,
    IdempotencyConflict,
    InvalidRequest,
    NotAMember,
    NotQuarantined,
    QuotaExceeded,
    Recoverable,
    StoreConflict,
    StoreError,
    StoreForbidden,
    StoreInvalid,
    StoreNotFound,
    StoreUnavailable,
    Unavailable,
)
from service.domain.faults import FaultPoint, FaultPoints, InjectedCrash, Point
from service.domain.ids import CommitKey
from service.domain.limits import CommitLimits, SenderQuota, validate_history_query, validate_send
from service.domain.model import (
    Abandoned,
    Abandonment,
    AbandonOutcome,
    Admission,
    AuthenticatedSend,
    CommitIntent,
    CommitState,
    Committed,
    CommittedMessage,
    Conflict,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    InProgress,
    LoadedCommit,
    OutboxPublication,
    QuarantinePage,
    RecoveryItem,
    RecoveryReport,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import Clock, MembershipStore, MessageStore, Outbox, SystemClock
from service.domain.recovery import RecoveryPolicy

log = logging.getLogger(__name__)


_STEPS_BEFORE: dict[Point, int] = {
    FaultPoint.AFTER_PUT_RECORD: 1,
    FaultPoint.OUTBOX_SENT_UNACKED: 2,  # sent together: the ack is simply not looked at
    FaultPoint.AFTER_OUTBOX_ACK: 2,
}
"""How many of a pipelined commit's steps (put_record, outbox append, commit
mark) come before each fault point they straddle."""
_PIPELINE_SPLITS = tuple(_STEPS_BEFORE)


class CommitObserver(Protocol):
    """Receives outcomes; the service layer turns them into metrics."""

    def outcome(self, outcome: str, reason: str = "") -> None:
        """``outcome`` is committed, replayed, conflict, recoverable or rejected."""

    def recovered(self, report: RecoveryReport) -> None:
        """One recovery call finished."""


class _NoObserver:
    def outcome(self, outcome: str, reason: str = "") -> None:
        pass

    def recovered(self, report: RecoveryReport) -> None:
        pass


MAX_AUDIT_OPERATOR = 100
MAX_AUDIT_REASON = 500
"""Bounds of an abandon's audit fields (operator text, never message content)."""


def new_message_id(now_ms: int) -> str:
    """A time-ordered message id: UUIDv7 layout, 48-bit ms time + 74 random bits."""
    rand = int.from_bytes(os.urandom(10), "big")
    value = (now_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76 | ((rand >> 62) & 0xFFF) << 64  # version 7, rand_a
    value |= 0b10 << 62 | (rand & ((1 << 62) - 1))  # variant, rand_b
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class _Alone:
    """``MessageCommitter._alone``'s context: a class, not an
    ``asynccontextmanager``, whose generator and wrapper cost about 5 us of CPU
    per commit (issue 27)."""

    __slots__ = ("_attempts", "_done", "_key")

    def __init__(self, attempts: dict[CommitKey, Event], key: CommitKey) -> None:
        self._attempts = attempts
        self._key = key

    async def __aenter__(self) -> None:
        while (running := self._attempts.get(self._key)) is not None:
            await running.wait()  # cancellation-safe: the attempt in flight is untouched
        self._done = self._attempts[self._key] = Event()

    async def __aexit__(self, *exc_info: object) -> None:
        del self._attempts[self._key]
        self._done.set()


class MessageCommitter:
    """Validates, reserves and commits sends; resumes and recovers intents."""

    def __init__(
        self,
        store: MessageStore,
        membership: MembershipStore,
        outbox: Outbox,
        *,
        limits: CommitLimits | None = None,
        faults: FaultPoints | None = None,
        clock: Clock | None = None,
        observer: CommitObserver | None = None,
        recovery: RecoveryPolicy | None = None,
        max_steps: int = 8,
    ) -> None:
        self._store = store
        self._membership = membership
        self._outbox = outbox
        self._limits = limits or CommitLimits()
        self._quota = SenderQuota(self._limits)
        self.faults = faults or FaultPoints()
        self._clock = clock or SystemClock()
        self._observer: CommitObserver = observer or _NoObserver()
        self._policy = recovery or RecoveryPolicy()
        self._max_steps = max_steps
        self._attempts: dict[CommitKey, Event] = {}
        self._sent_hook = lambda: self.faults.check(FaultPoint.OUTBOX_SENT_UNACKED)
        self._between_hook = lambda: self.faults.check(FaultPoint.BETWEEN_MARKS)

    # --- commit ------------------------------------------------------------

    async def commit(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> CommittedMessage:
        """Commit ``request`` with a caller-frozen delivery and candidate."""
        self._validate(request)
        async with self._alone(request.key):
            known = await self._before_admission(request)
            if known is not None:
                return await self._settle(request, known)
            if self._store.admits_in_reserve:
                return await self._commit_admitting(request, delivery, candidate)
            admission = await self._admit(request)
            return await self._commit(request, delivery, candidate, admission)

    async def commit_send(self, request: AuthenticatedSend) -> CommittedMessage:
        """Commit ``request`` as the gRPC surface does: admission and the version
        the delivery is frozen at come from one point lookup, the candidate is
        made here."""
        self._validate(request)
        async with self._alone(request.key):
            known = await self._before_admission(request)
            if known is not None:  # a replay, a conflict or an unfinished intent: no admission
                return await self._settle(request, known)
            now = self._clock.now_ms()
            candidate = ReserveCandidate(new_message_id(now), now)
            if self._store.admits_in_reserve:  # frozen at the version reserve reads
                return await self._commit_admitting(request, None, candidate)
            admission = await self._admit(request)
            delivery = FrozenDeliveryInput.at_version(admission.version)
            return await self._commit(request, delivery, candidate, admission)

    def _alone(self, key: CommitKey) -> _Alone:
        """Attempts of one key in this committer run one after another. A duplicate
        (a retry racing its first attempt, a double tap) waits for the attempt in
        flight, then reads its outcome from the store like any replay (one read on
        every backend) instead of racing it through every step: on Scylla that race
        is concurrent Paxos rounds on one row, which time out on a cluster."""
        return _Alone(self._attempts, key)

    async def _commit(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
        admission: Admission,
    ) -> CommittedMessage:
        key = request.key
        if not admission.member:
            return await self._existing_or_raise(
                request, NotAMember("sender is not a member of the conversation"), "not_member"
            )
        # No attempt of this key runs beside this one (``_alone``): a racing retry
        # waits and then replays, so it is never charged.
        try:
            self._quota.take(request.tenant, request.sender)
        except QuotaExceeded as exc:
            return await self._existing_or_raise(request, exc, "quota")
        try:
            result = await self._store.reserve(request, delivery, candidate)
        except StoreError as exc:
            raise self._recoverable(key, request.conversation, "reserve", exc) from exc
        return await self._reserved(request, result)

    async def _commit_admitting(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
    ) -> CommittedMessage:
        """``_commit`` on a store whose reserve decides admission in the same step
        (one round trip fewer); the outcomes are the same, in the same order."""
        try:
            self._quota.take(request.tenant, request.sender)
        except QuotaExceeded:  # the rare refusal: keep its order (a non-member is told so first)
            admission = await self._admit(request)
            frozen = delivery or FrozenDeliveryInput.at_version(admission.version)
            return await self._commit(request, frozen, candidate, admission)
        try:
            result = await self._store.reserve_admitted(request, delivery, candidate)
        except StoreError as exc:
            raise self._recoverable(request.key, request.conversation, "reserve", exc) from exc
        if result is None or isinstance(result, Admission):
            self._quota.refund(request.tenant, request.sender)
            if result is None:
                self._observer.outcome("rejected", "no_conversation")
                raise ConversationNotFound("conversation not found")
            return await self._existing_or_raise(  # as _commit does (a refusal: off the hot path)
                request, NotAMember("sender is not a member of the conversation"), "not_member"
            )
        return await self._reserved(request, result)

    async def _reserved(
        self, request: AuthenticatedSend, result: ReserveResult
    ) -> CommittedMessage:
        """Go on from what reserve answered."""
        key = request.key
        if not isinstance(result, Reserved):
            self._quota.refund(request.tenant, request.sender)  # a replay is never charged
        if isinstance(result, Committed):
            self._observer.outcome("replayed")
            return result.message
        if isinstance(result, Conflict):
            self._observer.outcome("conflict")
            raise IdempotencyConflict(key)
        if isinstance(result, Abandoned):
            raise self._abandoned()
        self.faults.check(FaultPoint.AFTER_RESERVE)
        return await self._drive(result.intent)

    def _validate(self, request: AuthenticatedSend) -> None:
        try:
            validate_send(request, self._limits)
        except InvalidRequest:
            self._observer.outcome("rejected", "invalid")
            raise

    async def _existing_or_raise(
        self, request: AuthenticatedSend, error: Exception, reason: str
    ) -> CommittedMessage:
        """A refused fresh send may still be a retry of an earlier, admitted one."""
        loaded = await self._load(request.key, request.conversation, request)
        if loaded is not None:
            return await self._settle(request, loaded)
        self._observer.outcome("rejected", reason)
        raise error

    async def _settle(self, request: AuthenticatedSend, loaded: LoadedCommit) -> CommittedMessage:
        """Answer a send whose key already has a durable state."""
        if isinstance(loaded, Committed):
            self._observer.outcome("replayed")
            return loaded.message
        if isinstance(loaded, InProgress):
            return await self._drive(loaded.intent)
        if isinstance(loaded, Abandoned):
            raise self._abandoned()
        self._observer.outcome("conflict")  # the key is another message's: that is the truth
        raise IdempotencyConflict(request.key)

    async def _before_admission(self, request: AuthenticatedSend) -> LoadedCommit | None:
        """What the store already knows of this key before admission (usually nothing)."""
        if not self._store.reads_before_admission:
            return None
        try:
            return await self._store.before_admission(request)
        except StoreError as exc:
            raise self._recoverable(request.key, request.conversation, "re-read", exc) from exc

    # --- the state machine -------------------------------------------------

    async def _drive(self, intent: CommitIntent) -> CommittedMessage:
        key, conversation = intent.key, intent.conversation
        published: OutboxPublication | None = None  # an outbox ack this drive already holds
        for _ in range(self._max_steps):
            try:
                if intent.state is CommitState.RESERVED and self._store.pipelines_with(
                    self._outbox
                ):
                    committed = await self._pipelined(intent)
                    if committed is not None:
                        return self._acked(committed)
                    intent = intent.advanced(CommitState.RECORDED)
                    continue
                if intent.state is CommitState.RESERVED:
                    await self._store.put_record(intent)
                    self.faults.check(FaultPoint.AFTER_PUT_RECORD)
                    intent = intent.advanced(CommitState.RECORDED)
                    continue
                if intent.state is CommitState.RECORDED:
                    if published is None:  # a failed mark reuses the ack, never republishes
                        published = await self._outbox.publish(intent, self._sent_hook)
                        self.faults.check(FaultPoint.AFTER_OUTBOX_ACK)
                    committed = await self._store.mark_published_and_committed(
                        intent, published, self._between_hook
                    )
                    return self._acked(committed)
                if intent.state is CommitState.OUTBOXED:
                    return self._acked(await self._store.mark_committed(intent))
                return self._acked(intent.committed_message())
            except (StoreConflict, StoreUnavailable) as exc:
                # A lost reply or a concurrent worker: the store knows the truth.
                log.info("commit re-reads its intent after %s", type(exc).__name__)
                log.debug("commit %s re-reads after %s", key, type(exc).__name__)
                loaded = await self._load(key, conversation)
                if isinstance(loaded, Committed):
                    return self._acked(loaded.message)
                if isinstance(loaded, Abandoned):  # an operator abandoned it meanwhile
                    raise self._abandoned() from exc
                if not isinstance(loaded, InProgress):
                    raise self._recoverable(key, conversation, "intent unreadable", exc) from exc
                intent = loaded.intent
            except StoreError as exc:  # corrupt data, a vanished conversation: never an ACK
                raise self._recoverable(key, conversation, "store refused", exc) from exc
        self._observer.outcome("recoverable", "no_progress")
        raise Recoverable(key, conversation, "no progress after retries", "NoProgress")

    async def _pipelined(self, intent: CommitIntent) -> CommittedMessage | None:
        """put_record, the outbox append and the commit mark in one round trip.
        With a fault point armed among them (tests, the campaign), only the steps
        before it are sent, then the point fires there, as in the steps path."""
        split = self.faults.first_armed(_PIPELINE_SPLITS)
        steps = 3 if split is None else _STEPS_BEFORE[split]
        committed = await self._store.finish_pipelined(intent, self._outbox, steps)
        if split is not None:
            self.faults.check(split)
        return committed

    def _abandoned(self) -> CommitAbandoned:
        self._observer.outcome("rejected", "abandoned")
        return CommitAbandoned()

    def _acked(self, message: CommittedMessage) -> CommittedMessage:
        self.faults.check(FaultPoint.AFTER_COMMIT_BEFORE_ACK)
        self._observer.outcome("committed")
        return message

    async def _load(
        self, key: CommitKey, conversation: str, request: AuthenticatedSend | None = None
    ) -> LoadedCommit | None:
        try:
            if request is not None:
                return await self._store.load_commit_for_request(request)
            return await self._store.load_commit(key, conversation)
        except StoreError as exc:
            raise self._recoverable(key, conversation, "re-read", exc) from exc

    def _recoverable(
        self, key: CommitKey, conversation: str, step: str, exc: Exception
    ) -> Recoverable:
        cause = type(exc).__name__
        log.warning("commit stopped at %s: %s", step, cause)
        log.debug("commit %s stopped at %s: %s", key, step, cause)
        self._observer.outcome("recoverable", step)
        return Recoverable(key, conversation, f"{step} failed", cause)

    # --- resume and recovery -----------------------------------------------

    async def resume(self, key: CommitKey, conversation: str) -> CommittedMessage:
        """Finish (or replay) the commit of ``key`` in ``conversation``."""
        key.validate()
        loaded = await self._load(key, conversation)
        if loaded is None or isinstance(loaded, Conflict):
            raise CommitNotFound("no commit for this key in this conversation")
        if isinstance(loaded, Abandoned):
            raise self._abandoned()
        if isinstance(loaded, Committed):
            self._observer.outcome("replayed")
            return loaded.message
        return await self._drive(loaded.intent)

    async def resume_existing(self, request: AuthenticatedSend) -> CommittedMessage | None:
        """Finish the commit of this exact request if one exists; None if none does."""
        validate_send(request, self._limits)
        loaded = await self._load(request.key, request.conversation, request)
        if loaded is None:
            return None
        if isinstance(loaded, Conflict):
            self._observer.outcome("conflict")
            raise IdempotencyConflict(request.key)
        if isinstance(loaded, Abandoned):
            raise self._abandoned()
        if isinstance(loaded, Committed):
            self._observer.outcome("replayed")
            return loaded.message
        return await self._drive(loaded.intent)

    async def recover_due(self, older_than_ms: int, max_items: int) -> RecoveryReport:
        """Work the recovery queue: drive the due intents created (or due again)
        before ``older_than_ms``. A failure pushes that item back with a delay
        or quarantines it; it never stops the others."""
        if max_items <= 0:
            raise InvalidRequest("max_items must be positive")
        try:
            items = await self._store.scan_recoverable_commits(older_than_ms, max_items)
        except StoreError as exc:
            raise Unavailable("recovery scan failed: backend unavailable") from exc
        committed = failed = quarantined = 0
        for item in items:
            if item.intent is None:  # undecodable: no attempt can succeed
                quarantined += await self._defer(item, item.problem or "undecodable", force=True)
                continue
            try:
                await self._drive(item.intent)
                committed += 1
            except Recoverable as exc:
                failed += 1
                quarantined += await self._defer(item, f"{exc.cause} at {exc.reason}")
            except InjectedCrash:
                raise  # a simulated process crash ends the run, as a real one would
            except Exception as exc:  # a defect met by one item costs that item only
                failed += 1
                log.error("recovery met an unexpected %s; the item is retried later",
                          type(exc).__name__)  # fmt: skip
                quarantined += await self._defer(item, f"{type(exc).__name__} at recovery")
        report = RecoveryReport(len(items), committed, failed, quarantined)
        self._observer.recovered(report)
        return report

    async def _defer(self, item: RecoveryItem, problem: str, *, force: bool = False) -> int:
        """Push a failed item back (or quarantine it); 1 when it was quarantined."""
        attempts = item.attempts + 1
        quarantine = force or self._policy.quarantines(attempts)
        try:
            await self._store.defer_recovery(
                item,
                retry_after_ms=self._policy.retry_after_ms(attempts),
                quarantine=quarantine,
                problem=problem,
            )
        except StoreError as exc:  # the next scan sees the item as due again
            log.warning("recovery could not record a failed attempt: %s", type(exc).__name__)
            return 0
        if quarantine:
            log.warning("recovery quarantined an intent after %d attempt(s): %s", attempts, problem)
            log.debug("recovery quarantined %s", item.key)
        return 1 if quarantine else 0

    # --- the quarantine, for operators ---------------------------------------

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        """One page of quarantined intents."""
        if not 1 <= limit <= 1000:
            raise InvalidRequest("page_size must be between 1 and 1000")
        try:
            return await self._store.quarantined(after, limit)
        except StoreInvalid as exc:
            raise InvalidRequest("page_token is not one this service issued") from exc
        except StoreError as exc:
            raise Unavailable("the recovery queue is unavailable: backend error") from exc

    async def recovery_item(self, key: CommitKey) -> RecoveryItem:
        """The queue item of ``key`` (queued or quarantined), for inspection."""
        key.validate()
        try:
            item = await self._store.recovery_item(key)
        except StoreError as exc:
            raise Unavailable("the recovery queue is unavailable: backend error") from exc
        if item is None:
            raise CommitNotFound("no unfinished intent for this key")
        return item

    async def retry_quarantined(self, key: CommitKey) -> CommittedMessage:
        """Put a quarantined intent back in the queue and try it now."""
        item = await self.recovery_item(key)
        try:
            await self._store.release_quarantined(key)
        except StoreError as exc:
            raise Unavailable("the recovery queue is unavailable: backend error") from exc
        loaded = await self._load(key, item.conversation)
        if isinstance(loaded, Committed):
            return loaded.message
        if isinstance(loaded, Abandoned):
            raise self._abandoned()
        if not isinstance(loaded, InProgress):
            raise CommitNotFound("no unfinished intent for this key")
        return await self._drive(loaded.intent)

    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        """An operator's final word on a quarantined intent (audited): its key then
        answers CommitAbandoned, its seq is a permanent gap, retention is released.
        Twice is the same as once; any key not quarantined is refused unchanged."""
        key.validate()
        operator, reason = operator.strip(), reason.strip()
        if not 1 <= len(operator) <= MAX_AUDIT_OPERATOR or not operator.isprintable():
            raise InvalidRequest(
                f"operator must be 1-{MAX_AUDIT_OPERATOR} printable characters (it is logged)"
            )
        if not 1 <= len(reason) <= MAX_AUDIT_REASON or not reason.isprintable():
            raise InvalidRequest(f"reason must be 1-{MAX_AUDIT_REASON} printable characters")
        try:
            done = await self._store.abandon_quarantined(key, operator, reason)
        except StoreError as exc:
            raise Unavailable("the recovery queue is unavailable: backend error") from exc
        if done.outcome is AbandonOutcome.NOT_QUARANTINED:
            raise NotQuarantined(
                "this key has no quarantined intent; only a quarantined intent can be"
                " abandoned (see `message-committer quarantine list`)"
            )
        log.warning(
            "operator %s abandoned a quarantined intent: tenant=%s sender=%s cmid=%s"
            " conversation=%s seq=%d (%s)",
            done.operator, key.tenant, key.sender, key.cmid, done.conversation, done.seq,
            done.outcome.value,
        )  # fmt: skip
        return done

    # --- reads -------------------------------------------------------------

    async def history(self, query: HistoryQuery) -> HistoryPage:
        """One history page for a member of the conversation."""
        validate_history_query(query, self._limits)
        try:
            return await self._store.history_page(query)
        except StoreForbidden as exc:
            raise NotAMember("actor (the reader) is not a member of the conversation") from exc
        except StoreNotFound as exc:
            raise ConversationNotFound("conversation not found") from exc
        except StoreInvalid as exc:
            raise InvalidRequest("the history request cannot be served as asked") from exc
        except StoreError as exc:
            raise Unavailable("history is unavailable: backend error") from exc

    async def readiness(self) -> None:
        """Raise Unavailable unless the store and the outbox answer."""
        try:
            await self._store.readiness()
            await self._outbox.readiness()
        except StoreError as exc:
            raise Unavailable(f"backend not ready: {exc}") from exc

    async def _admit(self, request: AuthenticatedSend) -> Admission:
        """The sender's admission at the current membership version (a point lookup)."""
        try:
            admission = await self._membership.admission(
                request.tenant, request.conversation, request.sender
            )
        except StoreError as exc:
            raise Unavailable("membership is unavailable: backend error") from exc
        if admission is None:
            self._observer.outcome("rejected", "no_conversation")
            raise ConversationNotFound("conversation not found")
        return admission
