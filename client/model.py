"""The client runtime's value types (seed 001): what a host hands in, what the
local store keeps, and what the server's mailbox pages look like on this side.

Messages, sends and history pages are the service's own domain types
(``service.domain.model``), so a send is persisted exactly as it goes on the
wire and the server's canonical identity of a resend is the same. Mailbox
types are defined here, from the wire contract (``mailbox.proto``).
"""

from __future__ import annotations

import enum
import re
import uuid
from dataclasses import dataclass

from service.domain.ids import check_id
from service.domain.model import AuthenticatedSend, MessageContent, MessageRecord

INBOX = "inbox"
CONVERSATION_LANE_PREFIX = "conversation:"


def conversation_lane(conversation: str) -> str:
    """The lane of a conversation too big to fan out into each member's inbox."""
    return CONVERSATION_LANE_PREFIX + conversation


def lane_conversation(lane: str) -> str | None:
    """The conversation of a ``conversation:<id>`` lane; None for the inbox."""
    if lane.startswith(CONVERSATION_LANE_PREFIX):
        return lane[len(CONVERSATION_LANE_PREFIX) :]
    return None


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """Who this runtime speaks for; there is no default account."""

    tenant: str
    user: str
    device: str

    def validate(self) -> ConnectRequest:
        check_id("tenant", self.tenant)
        check_id("user", self.user)
        check_id("device", self.device)
        return self


_CMID_UNSAFE = re.compile(r"[^A-Za-z0-9._~-]")
_DEVICE_PREFIX_MAX = 31  # + "-" + 32 hex digits = the 64 characters a cmid may have


def new_client_message_id(device: str = "") -> str:
    """A fresh cmid, ``<device>-<uuid hex>`` when a device is given: two devices
    of one user never draw the same one, whatever a host's own ids look like."""
    unique = uuid.uuid4().hex
    prefix = _CMID_UNSAFE.sub(".", device)[:_DEVICE_PREFIX_MAX]
    return f"{prefix}-{unique}" if prefix else unique


@dataclass(frozen=True, slots=True)
class SendMessage:
    """What the host asks to send; the runtime adds tenant, sender and device.

    ``cmid`` is the send's id: empty (the default) lets the runtime draw one
    that starts with the device id; a host that wants to repeat a call safely
    (after a cancellation, a crash of its own) passes its own."""

    conversation: str
    content: MessageContent
    cmid: str = ""
    mentions: tuple[str, ...] = ()
    reply_to: str = ""


@dataclass(frozen=True, slots=True)
class PendingSend:
    """A send persisted locally and not yet confirmed by the server.

    ``send`` is exactly what goes on the wire, every time (same cmid, same
    content): the server compares the canonical identity of a resend.
    ``attempts`` counts the times it was handed to the network (0: never, so
    the server cannot know it); ``parked`` ones wait for the host.
    """

    send: AuthenticatedSend
    created_ms: int
    attempts: int = 0
    first_attempt_ms: int = 0
    parked: bool = False
    problem: str = ""
    confirmed: bool = False
    """True only in what ``send_message`` returns for a repeat of a send that is
    already committed (its SendConfirmed came earlier): nothing is queued."""

    @property
    def cmid(self) -> str:
        return self.send.cmid

    @property
    def conversation(self) -> str:
        return self.send.conversation


class Origin(enum.StrEnum):
    """How a message reached the local store."""

    MAILBOX = "mailbox"
    HISTORY = "history"
    OWN = "own"
    """This device's send, confirmed by its ACK or found by reconciliation."""


@dataclass(frozen=True, slots=True)
class LocalMessage:
    """A message as the local store holds it."""

    record: MessageRecord
    origin: Origin

    @property
    def message_id(self) -> str:
        return self.record.message_id

    @property
    def conversation(self) -> str:
        return self.record.conversation

    @property
    def seq(self) -> int:
        return self.record.seq


# --- mailboxes (the wire contract of MailboxService) -------------------------------


@dataclass(frozen=True, slots=True)
class MailboxCursor:
    """The last mailbox seq applied in one lane's epoch (epoch 0, seq 0: from the start)."""

    lane: str = INBOX
    epoch: int = 0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class MailboxEvent:
    """One mailbox entry: a message added to a conversation of the user, or (with
    ``record`` None) an event of a kind this runtime does not know, kept as the
    ``opaque`` bytes of its wire form: its seq is applied, nothing is added."""

    seq: int
    group_id: int
    record: MessageRecord | None
    delivered_ts_ms: int = 0
    opaque: bytes = b""


@dataclass(frozen=True, slots=True)
class MailboxPage:
    """One Sync answer: complete groups after a cursor and the cursor to store."""

    lane: str
    events: tuple[MailboxEvent, ...]
    next_cursor: MailboxCursor
    more: bool = False
    trim_watermark: int = 0
    head: int = 0


@dataclass(frozen=True, slots=True)
class MailboxHint:
    """A live push: lane ``lane`` has entries up to ``seq``. Never moves a cursor."""

    lane: str
    epoch: int
    seq: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The Subscribe stream's liveness signal (the runtime's PONG)."""

    server_time_ms: int


@dataclass(frozen=True, slots=True)
class ExpiredCursor:
    """What a CURSOR_EXPIRED answer says: continue from (lane, epoch, trim_watermark)
    after a rebuild."""

    lane: str
    epoch: int
    trim_watermark: int
    why: str = ""


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    """An entry of the authoritative conversation list (ListConversations)."""

    conversation: str
    version: int
    member_count: int
    lane: str = INBOX


@dataclass(frozen=True, slots=True)
class LeftConversation:
    """An entry of the list of conversations the user left (ListLeftConversations)."""

    conversation: str
    lane: str
    left_at_version: int
    left_at_ms: int


@dataclass(frozen=True, slots=True)
class LeftConversationPage:
    conversations: tuple[LeftConversation, ...]
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class ConversationPage:
    conversations: tuple[ConversationSummary, ...]
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class MemberPageRequest:
    """One page of a conversation's members (ListMembers)."""

    conversation: str
    page_size: int = 0
    page_token: str = ""


@dataclass(frozen=True, slots=True)
class RebuildPlan:
    """What a REBUILD of one lane will do: backfill these conversations' history,
    then continue the lane from (epoch, trim_watermark)."""

    lane: str
    epoch: int
    trim_watermark: int
    conversations: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConversationView:
    """The local projection of one conversation."""

    conversation: str
    lane: str
    last_seq: int
    last_message_id: str
    last_ts_ms: int
    message_count: int
    member_count: int
    listed: bool
    """True when the last authoritative list (a rebuild) had it."""


@dataclass(frozen=True, slots=True)
class Backfill:
    """The progress of one conversation's history backfill in a REBUILD.

    Pages go backward from the newest message; ``anchor`` is where the next
    page starts (0: the newest), ``floor_seq`` where it may stop (the newest
    seq the store held before the rebuild, less an overlap).
    """

    lane: str
    conversation: str
    floor_seq: int
    anchor: int = 0
    fetched: int = 0
    done: bool = False
