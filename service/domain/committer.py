"""MessageCommitter: drives one send to COMMITTED (DESIGN §5).

The only place a CommittedMessage (and so a SEND_ACK) comes from. It
validates and freezes everything before reserve, then walks the state
machine from whatever the durable state is; a lost response or another
worker's advance is answered by re-reading the store and going forward.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

from service.domain.errors import (
    CommitNotFound,
    ConversationNotFound,
    IdempotencyConflict,
    InvalidRequest,
    NotAMember,
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
from service.domain.faults import FaultPoint, FaultPoints
from service.domain.ids import CommitKey
from service.domain.limits import CommitLimits, SenderQuota, validate_history_query, validate_send
from service.domain.model import (
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
    Membership,
    ReserveCandidate,
)
from service.domain.ports import Clock, MembershipStore, MessageStore, Outbox, SystemClock

log = logging.getLogger(__name__)


class CommitObserver(Protocol):
    """Receives outcomes; the service layer turns them into metrics."""

    def outcome(self, outcome: str, reason: str = "") -> None:
        """``outcome`` is committed, replayed, conflict, recoverable or rejected."""

    def recovered(self, count: int, failed: int) -> None:
        """One recovery run finished."""


class _NoObserver:
    def outcome(self, outcome: str, reason: str = "") -> None:
        pass

    def recovered(self, count: int, failed: int) -> None:
        pass


def new_message_id(now_ms: int) -> str:
    """A time-ordered message id: UUIDv7 layout, 48-bit ms time + 74 random bits."""
    rand = int.from_bytes(os.urandom(10), "big")
    value = (now_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76 | ((rand >> 62) & 0xFFF) << 64  # version 7, rand_a
    value |= 0b10 << 62 | (rand & ((1 << 62) - 1))  # variant, rand_b
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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
        self._max_steps = max_steps

    # --- commit ------------------------------------------------------------

    async def commit(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> CommittedMessage:
        """Commit ``request`` with a caller-frozen delivery and candidate."""
        self._validate(request)
        membership = await self._current_membership(request.tenant, request.conversation)
        return await self._commit(request, delivery, candidate, membership)

    async def commit_send(self, request: AuthenticatedSend) -> CommittedMessage:
        """Commit ``request`` as the gRPC surface does: the delivery is frozen
        from the membership store and the candidate made here."""
        self._validate(request)
        membership = await self._current_membership(request.tenant, request.conversation)
        now = self._clock.now_ms()
        candidate = ReserveCandidate(new_message_id(now), now)
        return await self._commit(request, membership.delivery(), candidate, membership)

    async def _commit(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
        membership: Membership,
    ) -> CommittedMessage:
        key = request.key
        if request.sender not in membership.members:
            return await self._existing_or_raise(
                request, NotAMember("sender is not a member of the conversation"), "not_member"
            )
        try:
            self._quota.take(request.tenant, request.sender)
        except QuotaExceeded as exc:
            return await self._existing_or_raise(request, exc, "quota")
        try:
            result = await self._store.reserve(request, delivery, candidate)
        except StoreError as exc:
            raise self._recoverable(key, request.conversation, "reserve", exc) from exc
        if isinstance(result, Committed):
            self._observer.outcome("replayed")
            return result.message
        if isinstance(result, Conflict):
            self._observer.outcome("conflict")
            raise IdempotencyConflict(key)
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
        """A rejected fresh send may still be a retry of an earlier, admitted one."""
        loaded = await self._load(request.key, request.conversation, request)
        if isinstance(loaded, Committed):
            self._observer.outcome("replayed")
            return loaded.message
        if isinstance(loaded, InProgress):
            return await self._drive(loaded.intent)
        self._observer.outcome("rejected", reason)
        raise error

    # --- the state machine -------------------------------------------------

    async def _drive(self, intent: CommitIntent) -> CommittedMessage:
        key, conversation = intent.key, intent.conversation
        for _ in range(self._max_steps):
            try:
                if intent.state is CommitState.RESERVED:
                    await self._store.put_record(intent)
                    self.faults.check(FaultPoint.AFTER_PUT_RECORD)
                    intent = intent.advanced(CommitState.RECORDED)
                    continue
                if intent.state is CommitState.RECORDED:
                    return self._acked(await self._publish_and_commit(intent))
                if intent.state is CommitState.OUTBOXED:
                    return self._acked(await self._store.mark_committed(intent))
                return self._acked(intent.committed_message())
            except (StoreConflict, StoreUnavailable) as exc:
                # A lost reply or a concurrent worker: the store knows the truth.
                log.info("commit %s re-reads after %s", key, type(exc).__name__)
                loaded = await self._load(key, conversation)
                if isinstance(loaded, Committed):
                    return self._acked(loaded.message)
                if not isinstance(loaded, InProgress):
                    raise self._recoverable(key, conversation, "intent unreadable", exc) from exc
                intent = loaded.intent
            except StoreError as exc:  # corrupt data, a vanished conversation: never an ACK
                raise self._recoverable(key, conversation, "store refused", exc) from exc
        self._observer.outcome("recoverable", "no_progress")
        raise Recoverable(key, conversation, "no progress after retries")

    async def _publish_and_commit(self, intent: CommitIntent) -> CommittedMessage:
        publication = await self._outbox.publish(intent)
        self.faults.check(FaultPoint.OUTBOX_SENT_UNACKED)
        self.faults.check(FaultPoint.AFTER_OUTBOX_ACK)
        if self._store.atomic_publish_commit:
            return await self._store.mark_published_and_committed(intent, publication)
        await self._store.mark_outbox_published(intent, publication)
        self.faults.check(FaultPoint.BETWEEN_MARKS)
        return await self._store.mark_committed(intent.advanced(CommitState.OUTBOXED, publication))

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
        log.warning("commit %s stopped at %s: %s", key, step, type(exc).__name__)
        self._observer.outcome("recoverable", step)
        return Recoverable(key, conversation, f"{step} failed")

    # --- resume and recovery -----------------------------------------------

    async def resume(self, key: CommitKey, conversation: str) -> CommittedMessage:
        """Finish (or replay) the commit of ``key`` in ``conversation``."""
        key.validate()
        loaded = await self._load(key, conversation)
        if loaded is None or isinstance(loaded, Conflict):
            raise CommitNotFound("no commit for this key in this conversation")
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
        if isinstance(loaded, Committed):
            self._observer.outcome("replayed")
            return loaded.message
        return await self._drive(loaded.intent)

    async def recover_due(self, older_than_ms: int, max_items: int) -> int:
        """Drive unfinished intents created before ``older_than_ms``; return how
        many reached COMMITTED. One intent's failure does not stop the rest."""
        if max_items <= 0:
            raise InvalidRequest("max_items must be positive")
        try:
            intents = await self._store.scan_recoverable_commits(older_than_ms, max_items)
        except StoreError as exc:
            raise Unavailable("recovery scan failed: backend unavailable") from exc
        done = failed = 0
        for intent in intents:
            try:
                await self._drive(intent)
                done += 1
            except Recoverable:
                failed += 1
        self._observer.recovered(done, failed)
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
            raise InvalidRequest(str(exc)) from exc
        except StoreError as exc:
            raise Unavailable("history is unavailable: backend error") from exc

    async def readiness(self) -> None:
        """Raise Unavailable unless the store and the outbox answer."""
        try:
            await self._store.readiness()
            await self._outbox.readiness()
        except StoreError as exc:
            raise Unavailable(f"backend not ready: {exc}") from exc

    async def _current_membership(self, tenant: str, conversation: str) -> Membership:
        try:
            membership = await self._membership.membership(tenant, conversation)
        except StoreError as exc:
            raise Unavailable("membership is unavailable: backend error") from exc
        if membership is None:
            self._observer.outcome("rejected", "no_conversation")
            raise ConversationNotFound("conversation not found")
        return membership
