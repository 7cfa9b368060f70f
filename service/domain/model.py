"""Domain types of one commit (DESIGN.md §2-§4).

All types are frozen: a value handed to a store can never be changed behind
its back. Nothing here does I/O or validation against configuration; see
``service.domain.limits`` for the rules a request must satisfy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from service.domain import identity
from service.domain.ids import CommitKey


class MessageType(enum.StrEnum):
    """The kind of a message. CUSTOM requires a ``custom_type`` name."""

    TEXT = "text"
    IMAGE = "image"
    FILE = "file"
    AUDIO = "audio"
    VIDEO = "video"
    LOCATION = "location"
    CUSTOM = "custom"


@dataclass(frozen=True, slots=True)
class BodyReference:
    """A body stored elsewhere (an object store): where, how big, which bytes."""

    uri: str
    size_bytes: int
    sha256: str = ""  # lowercase hex, or empty when the caller has no digest


@dataclass(frozen=True, slots=True)
class MessageContent:
    """What was sent: a type, an optional custom type, and one body form.

    Exactly one of ``body`` (inline bytes, may be empty only together with a
    reference) and ``body_ref`` carries the body.
    """

    message_type: MessageType
    body: bytes = b""
    body_ref: BodyReference | None = None
    custom_type: str = ""


@dataclass(frozen=True, slots=True)
class AuthenticatedSend:
    """A send request whose tenant, sender and device the gateway authenticated."""

    tenant: str
    sender: str
    device: str
    conversation: str
    cmid: str
    content: MessageContent
    mentions: tuple[str, ...] = ()
    reply_to: str = ""  # message id replied to, or empty

    @property
    def key(self) -> CommitKey:
        return CommitKey(self.tenant, self.sender, self.cmid)

    def canonical_identity(self) -> bytes:
        """The legacy whole identity (header ``QIMC``); see ``identity``."""
        return identity.canonical_identity(self)

    def reserve_identity_digest(self) -> bytes:
        """The current stored identity (header ``QIMD``); see ``identity``."""
        return identity.reserve_identity_digest(self)

    def matches_identity(self, stored: bytes) -> bool:
        """True when ``stored`` (either form) identifies this very send."""
        return identity.matches(self, stored)

    def stored_identity(self, whole: bool = False) -> bytes:
        """What a reserve persists: the digest, or the legacy whole form that
        versions before the digest wrote (backends open with ``identity_form``)."""
        return self.canonical_identity() if whole else self.reserve_identity_digest()

    def record_at(self, seq: int, candidate: ReserveCandidate) -> MessageRecord:
        """The canonical record of this send at ``seq`` with the candidate's coordinates."""
        return MessageRecord(
            tenant=self.tenant,
            conversation=self.conversation,
            seq=seq,
            message_id=candidate.message_id,
            sender=self.sender,
            device=self.device,
            cmid=self.cmid,
            content=self.content,
            mentions=self.mentions,
            reply_to=self.reply_to,
            server_ts_ms=candidate.server_ts_ms,
        )


@dataclass(frozen=True, slots=True)
class FrozenDeliveryInput:
    """The delivery facts fixed before reserve, never replaced by later membership.

    Current form (DESIGN §9): by reference, ``recipients`` is None and the
    recipients are the conversation's members at ``membership_version``, which
    the membership store keeps readable in pages while anything refers to it.
    So a send costs the same in a 4-member and a million-member conversation.
    Legacy form (release 1, still read and committed): the recipient ids inline.
    """

    recipients: tuple[str, ...] | None
    membership_version: int

    @classmethod
    def at_version(cls, version: int) -> FrozenDeliveryInput:
        """The by-reference form: the members of the conversation at ``version``."""
        return cls(None, version)

    @property
    def by_reference(self) -> bool:
        return self.recipients is None

    @property
    def reading_version(self) -> int:
        """The membership version that decides who reads the message (DESIGN §10,
        ``mailbox.readable``): the version the delivery was frozen at; 0, unknown,
        for a release-1 delivery (recipients frozen inline, not as a version)."""
        return 0 if self.recipients is not None else self.membership_version


@dataclass(frozen=True, slots=True)
class ReserveCandidate:
    """Coordinates proposed before reserve; only the first reserve's are kept."""

    message_id: str
    server_ts_ms: int


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """The canonical stored message, exactly as history will hold it."""

    tenant: str
    conversation: str
    seq: int
    message_id: str
    sender: str
    device: str
    cmid: str
    content: MessageContent
    mentions: tuple[str, ...]
    reply_to: str
    server_ts_ms: int

    def size_bytes(self) -> int:
        """What the record weighs against a history page's byte limit."""
        ref = self.content.body_ref
        ids = (
            self.conversation,
            self.message_id,
            self.sender,
            self.device,
            self.cmid,
            self.reply_to,
            self.content.custom_type,
            *self.mentions,
        )
        ref_len = len(ref.uri) + len(ref.sha256) + 8 if ref else 0
        return 32 + len(self.content.body) + ref_len + sum(len(i) for i in ids)


class CommitState(enum.StrEnum):
    """Where one commit stands. Only ever moves forward."""

    RESERVED = "reserved"
    RECORDED = "recorded"
    OUTBOXED = "outboxed"
    COMMITTED = "committed"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {
    CommitState.RESERVED: 0,
    CommitState.RECORDED: 1,
    CommitState.OUTBOXED: 2,
    CommitState.COMMITTED: 3,
}


@dataclass(frozen=True, slots=True)
class OutboxPublication:
    """The outbox's durable acknowledgement: which stream, which position."""

    stream: str
    position: str


@dataclass(frozen=True, slots=True)
class CommittedMessage:
    """What SEND_ACK is made of. It says committed; nothing about delivery."""

    conversation: str
    cmid: str
    message_id: str
    seq: int
    server_ts_ms: int


@dataclass(frozen=True, slots=True)
class CommitIntent:
    """The durable intent: every fact needed to finish the commit."""

    key: CommitKey
    identity: bytes
    record: MessageRecord
    delivery: FrozenDeliveryInput
    state: CommitState
    created_at_ms: int
    publication: OutboxPublication | None = None

    @property
    def conversation(self) -> str:
        return self.record.conversation

    def committed_message(self) -> CommittedMessage:
        r = self.record
        return CommittedMessage(r.conversation, r.cmid, r.message_id, r.seq, r.server_ts_ms)

    def advanced(
        self, state: CommitState, publication: OutboxPublication | None = None
    ) -> CommitIntent:
        """A copy moved forward to ``state`` (keeping a known publication)."""
        return replace(self, state=state, publication=publication or self.publication)


# --- results of reserve and load -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reserved:
    """First reserve for the key: the intent was persisted with new coordinates."""

    intent: CommitIntent


@dataclass(frozen=True, slots=True)
class InProgress:
    """The key has an unfinished intent; continue from ``intent.state``."""

    intent: CommitIntent


@dataclass(frozen=True, slots=True)
class Committed:
    """The key is committed; replay this ACK."""

    message: CommittedMessage


@dataclass(frozen=True, slots=True)
class Conflict:
    """The key belongs to a different request; never ACK this one."""

    key: CommitKey


@dataclass(frozen=True, slots=True)
class Abandoned:
    """An operator abandoned the key's quarantined intent: never ACKed, never
    recoverable, and not reserved again within the idempotency window."""

    key: CommitKey


ReserveResult = Reserved | InProgress | Committed | Conflict | Abandoned
LoadedCommit = InProgress | Committed | Conflict | Abandoned


# --- history ---------------------------------------------------------------------


class Direction(enum.StrEnum):
    """BACKWARD pages towards older messages, FORWARD towards newer."""

    BACKWARD = "backward"
    FORWARD = "forward"


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """One page request. ``anchor_seq`` is exclusive; 0 means "from the edge"."""

    tenant: str
    conversation: str
    actor: str
    direction: Direction = Direction.BACKWARD
    anchor_seq: int = 0
    limit: int = 50
    max_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Records in page order plus the boundaries that make gaps readable.

    * ``available_from_seq``: every seq below it was trimmed or expired; a
      missing seq at or above it was never recorded (a lost reservation race,
      or an intent recovery has not finished yet): a gap, not a loss.
    * ``abandoned_seqs``: the missing seqs within this page's span that will
      never be recorded (an operator abandoned their quarantined intent): a
      permanent gap, unlike the other missing seqs, which may still fill.
    * ``last_seq``: the highest sequence number allocated so far.
    * ``next_anchor``: pass as ``anchor_seq`` for the next page; 0 when the
      page reached the end in its direction. Set on a page with no records
      too, when every record it scanned was hidden.
    * ``hidden_seqs``: the seqs within this page's span whose records exist
      but were committed while the reader was not a member (DESIGN §10's
      reading rule, ``service.domain.history``): never shown to this reader;
      not a gap and not a loss.
    """

    conversation: str
    direction: Direction
    anchor_seq: int
    max_bytes: int
    records: tuple[MessageRecord, ...]
    available_from_seq: int
    last_seq: int
    next_anchor: int = 0
    truncated_by_bytes: bool = False
    abandoned_seqs: tuple[int, ...] = ()
    hidden_seqs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MembershipInfo:
    """A conversation's membership version and size (what a change returns)."""

    tenant: str
    conversation: str
    version: int
    member_count: int


@dataclass(frozen=True, slots=True)
class Admission:
    """A point lookup at the current version: is the user a member now?"""

    version: int
    member: bool


@dataclass(frozen=True, slots=True)
class MembersSlice:
    """Members of one version in user-id order, as a store reads them.

    ``next_after`` continues the listing (pass it as ``after``); "" at the end.
    """

    members: tuple[str, ...]
    version: int
    next_after: str = ""


@dataclass(frozen=True, slots=True)
class MemberPage:
    """One page of ListMembers: sorted user ids and an opaque continuation token."""

    members: tuple[str, ...]
    version: int
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One message as the outbox handed it to downstream delivery.

    ``recipients`` is None for a delivery frozen by reference: the recipients
    are the conversation's members at ``membership_version``.
    """

    publication: OutboxPublication
    tenant: str
    conversation: str
    seq: int
    message_id: str
    recipients: tuple[str, ...] | None
    membership_version: int = 0
    published_ms: int = 0
    """When the outbox took it (the backend's clock; 0 when unknown): the relay's
    lag and commit-to-mailbox latency are measured from here."""


@dataclass(frozen=True, slots=True)
class OutboxPage:
    """Outbox entries and the token to read on from (the same token again, and
    no entries, once everything written so far was read)."""

    entries: tuple[OutboxEntry, ...]
    next_after: str


# --- the recovery queue ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecoveryItem:
    """One unfinished intent in the recovery queue (DESIGN §12).

    ``intent`` is None when the stored intent could not be decoded; then
    ``problem`` says why (an error class, never stored content). After a failed
    attempt ``problem`` names the last failure. A quarantined item is kept,
    never deleted and never ACKed, until an operator retries it.
    """

    key: CommitKey
    conversation: str
    created_at_ms: int
    attempts: int = 0
    intent: CommitIntent | None = None
    problem: str = ""
    quarantined: bool = False


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What one ``recover_due`` call did."""

    scanned: int = 0
    committed: int = 0
    failed: int = 0
    quarantined: int = 0

    def __add__(self, other: RecoveryReport) -> RecoveryReport:
        return RecoveryReport(
            self.scanned + other.scanned,
            self.committed + other.committed,
            self.failed + other.failed,
            self.quarantined + other.quarantined,
        )


@dataclass(frozen=True, slots=True)
class RecoveryStats:
    """The recovery queue at a glance (for gauges): no scan of intents needed."""

    oldest_unfinished_ms: int | None
    """Creation time of the oldest unfinished intent still in the queue (the
    quarantined ones have an alert of their own)."""
    quarantined: int


class AbandonOutcome(enum.StrEnum):
    """What ``abandon_quarantined`` did."""

    ABANDONED = "abandoned"
    ALREADY_ABANDONED = "already_abandoned"
    NOT_QUARANTINED = "not_quarantined"
    """Refused: the key has no quarantined intent (nothing was changed)."""


@dataclass(frozen=True, slots=True)
class Abandonment:
    """The audit record of an abandon: who, when (the store's time), why, and the
    seq left as a permanent gap (0 when the intent's seq could not be read)."""

    outcome: AbandonOutcome
    conversation: str = ""
    seq: int = 0
    at_ms: int = 0
    operator: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class QuarantinePage:
    """Quarantined items in a stable order, and where the next page starts ("" = end)."""

    items: tuple[RecoveryItem, ...]
    next_token: str = ""
