"""The two error families of the service.

::

    StoreError                   raised by a MessageStore / MembershipStore / Outbox
    ├── StoreUnavailable         the dependency did not answer (connection, timeout);
    │   ├── StoreOutcomeUnknown  a write was sent but its outcome is unknown
    │   │   └── StoreNotReplicated  applied, but not on enough replicas yet
    │   ├── StoreWiped           the data is not this deployment's any more (wiped,
    │   │                        replaced, an empty replica promoted)
    │   └── StoreMisconfigured   a backend setting could lose ACKed data (eviction)
    ├── StoreConflict            a conditional step was refused: wrong prior state,
    │   │                        a different publication, a missing record
    │   ├── IllegalTransition    an outbox entry state change the relay's state
    │   │                        machine forbids (never silently normalised)
    │   ├── LeaseLost            a partition operation by a relay whose lease
    │   │                        token is no longer the partition's latest
    │   └── StoreFenced          a mailbox write carrying a fencing token older
    │                            than one the mailbox has already seen
    ├── StoreNotFound            the addressed thing does not exist (conversation, ...)
    ├── StoreAlreadyExists       a create met an existing thing (conversation)
    ├── StoreForbidden           the actor is not a member of the conversation
    ├── StoreInvalid             a query the store cannot serve as asked
    ├── StoreCorrupt             stored data could not be decoded
    └── StoreSchemaError         the schema is missing, older or newer than this
                                 version expects (fail closed at start-up)

    CommitError                  raised by MessageCommitter
    ├── InvalidRequest           a malformed field (id, content, mentions, page size)
    │   └── InvalidClientMessageId
    ├── NotAMember               sender (or history actor) not in the conversation
    ├── ConversationNotFound     the conversation does not exist
    ├── QuotaExceeded            the sender's send quota is used up
    ├── IdempotencyConflict      the key was used before by a different request
    ├── Recoverable              the commit stopped part-way; the same key finishes it
    ├── CommitNotFound           resume of a key that was never reserved
    ├── CommitAbandoned          an operator abandoned the key's quarantined intent:
    │                            never ACKed; send again with a new cmid
    ├── NotQuarantined           abandon of a key that has no quarantined intent
    ├── CursorExpired            a mailbox cursor below the trim watermark, of another
    │                            epoch, or ahead of the lane: rebuild, never an
    │                            empty page
    └── Unavailable              the backend is not ready (readiness, reads)

Messages are written for the caller: they name fields and rules, never the
message body, a connection string, a storage key, a table or a script.
Backends translate their driver's exceptions into the StoreError family at
their boundary (``raise StoreUnavailable(...) from exc``); nothing else
crosses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.domain.ids import CommitKey


class StoreError(Exception):
    """Root of every error a storage backend may raise."""


class StoreUnavailable(StoreError):
    """The backend could not be reached or did not answer in time."""

    operator_hint: str = ""
    """A fixed sentence for readiness and the start-up error, when the cause is
    something an operator must act on (never backend text)."""


class StoreWiped(StoreUnavailable):
    """The backend no longer holds this deployment's data: wiped, replaced or
    an empty replica promoted. Never silently re-initialised."""

    operator_hint = (
        "the backend's deployment identity is missing or different: its data was wiped"
        " or replaced; restore it, or initialise a new one on purpose with"
        " `message-committer migrate`"
    )


class StoreMisconfigured(StoreUnavailable):
    """The backend runs with a setting that can lose acknowledged data."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.operator_hint = hint


class StoreOutcomeUnknown(StoreUnavailable):
    """A write was sent but whether it applied is unknown (e.g. CAS timeout).

    Callers must re-read the durable state before deciding anything.
    """


class StoreNotReplicated(StoreOutcomeUnknown):
    """A write applied on the primary but too few replicas acknowledged it in time:
    a failover now could lose it, so it is not yet an ACK (retry the same key)."""


class StoreConflict(StoreError):
    """A conditional step was refused because the stored state does not allow it."""


class IllegalTransition(StoreConflict):
    """An outbox entry was asked to move between states the relay's state machine
    does not connect (``service.domain.relay.TRANSITIONS``)."""


class LeaseLost(StoreConflict):
    """The relay's lease on an outbox partition is gone: another relay holds a
    newer fencing token, so this one may record nothing for that partition."""


class StoreFenced(StoreConflict):
    """A mailbox refused a write whose fencing token is older than one it has
    already accepted for that partition: the writer was deposed."""


class StoreNotFound(StoreError):
    """The addressed object (a conversation, usually) does not exist."""


class StoreAlreadyExists(StoreError):
    """A create met an object that already exists."""


class StoreForbidden(StoreError):
    """The actor is not a member of the conversation it tried to read."""


class StoreInvalid(StoreError):
    """The request to the store is malformed (a bad page size, a bad anchor)."""


class StoreCorrupt(StoreError):
    """Stored data could not be decoded; never silently repaired."""


class StoreSchemaError(StoreError):
    """The backend's schema is not the one this version runs on; migrate first."""


class CommitError(Exception):
    """Root of every error MessageCommitter raises."""


class InvalidRequest(CommitError):
    """A field of the request breaks a documented rule."""


class InvalidClientMessageId(InvalidRequest):
    """The ClientMessageId is empty, too long or has forbidden characters."""


class NotAMember(CommitError):
    """The sender (or history reader) is not a member of the conversation."""


class ConversationNotFound(CommitError):
    """The conversation does not exist in this tenant."""


class QuotaExceeded(CommitError):
    """The sender sent more than the configured quota allows; retry later."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IdempotencyConflict(CommitError):
    """The CommitKey was already used by a request that differs from this one."""

    def __init__(self, key: CommitKey) -> None:
        super().__init__(
            "client_message_id was already used by this sender for a different message"
        )
        self.key = key


class Recoverable(CommitError):
    """The commit stopped between durable steps; retrying the same key finishes it.

    Never a success: no ACK may be built from it.
    """

    def __init__(self, key: CommitKey, conversation: str, reason: str, cause: str = "") -> None:
        super().__init__(f"commit not finished ({reason}); retry with the same key")
        self.key = key
        self.conversation = conversation
        self.reason = reason
        self.cause = cause
        """The class name of the store error that stopped it (for the recovery
        queue and logs; never shown to callers)."""


class CommitNotFound(CommitError):
    """Resume was asked for a key that has no intent (or it expired)."""


class CommitAbandoned(CommitError):
    """An operator abandoned this key's quarantined intent: it is never ACKed and
    never recoverable; the key refuses every send for the idempotency window."""

    def __init__(
        self,
        message: str = "this send was abandoned by an operator; send again with a new"
        " client_message_id",
    ) -> None:
        super().__init__(message)


class NotQuarantined(CommitError):
    """Abandon was asked for a key that has no quarantined intent (nothing changed)."""


class CursorExpired(CommitError):
    """A Sync cursor the lane cannot continue from: below its trim watermark, of
    another epoch, or ahead of what the lane holds. The client rebuilds (seed
    001's REBUILD), then syncs on from ``(lane, epoch, trim_watermark)``."""

    def __init__(self, lane: str, epoch: int, trim_watermark: int, why: str) -> None:
        super().__init__(
            f"the mailbox cursor cannot continue ({why}); rebuild, then sync from the"
            " trim watermark of the lane's current epoch"
        )
        self.lane = lane
        self.epoch = epoch
        self.trim_watermark = trim_watermark
        self.why = why


class Unavailable(CommitError):
    """The backend or the outbox is not available."""
