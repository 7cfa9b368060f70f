"""The LocalStore port (DESIGN §11): what the runtime keeps on the device.

Every method is one local transaction. What a transaction reports (the
messages it added, the sends it confirmed) is exactly what it changed, so
the runtime's events never repeat a message.

Pending sends are the one table that is not rebuildable from the server:
``reset_for_rebuild`` and a reset on open keep them; everything else
(messages, the conversation projection, cursors) can be fetched again.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from client.model import (
    Backfill,
    ConnectRequest,
    ConversationSummary,
    ConversationView,
    ExpiredCursor,
    LocalMessage,
    MailboxCursor,
    MailboxPage,
    PendingSend,
)
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    HistoryPage,
    MessageContent,
)


@dataclass(frozen=True, slots=True)
class Confirmation:
    """A pending send resolved in a transaction, with its server coordinates."""

    cmid: str
    message: CommittedMessage


@dataclass(frozen=True, slots=True)
class Conflict:
    """A pending send parked because a message with its cmid and another identity
    (another device's, other content) is committed: the server refuses it."""

    cmid: str
    conversation: str


CONFLICT_PROBLEM = "IdempotencyConflict: the cmid is committed with other content"


@dataclass(frozen=True, slots=True)
class Applied:
    """What one applied batch (a mailbox page or a history page) changed."""

    added: tuple[LocalMessage, ...] = ()
    """Messages new to the store, other than this device's confirmed sends."""
    confirmed: tuple[Confirmation, ...] = ()
    """Pending sends the batch showed committed (their own message arrived)."""
    conflicts: tuple[Conflict, ...] = ()
    """Pending sends the batch parked: their cmid arrived with another identity."""


@dataclass(frozen=True, slots=True)
class ResetReport:
    """Why and how a store was recreated on open."""

    reason: str
    kept_pending: int
    lost_pending: bool = False
    """True when the pending table, or a row of it, could not be read."""
    report_id: int = 0
    """Its row in the store (0: not stored), until the host takes the event."""


class LocalStore(abc.ABC):
    """Pending sends, messages, the conversation projection and mailbox cursors."""

    persistent: bool
    """False only for the in-memory store a test picks explicitly."""

    reset_report: ResetReport | None = None
    """Set when opening had to reset the store; the runtime emits LocalStoreReset."""

    @abc.abstractmethod
    async def untaken_resets(self) -> list[ResetReport]:
        """Reports of resets whose LocalStoreReset no host has taken yet, oldest
        first: kept in the store across process deaths until ``taken_reset``."""

    @abc.abstractmethod
    async def taken_reset(self, report_id: int) -> None:
        """The host took the LocalStoreReset of report ``report_id``: forget it."""

    @abc.abstractmethod
    async def bind_account(self, account: ConnectRequest) -> None:
        """Bind a fresh store to ``account``; AccountMismatch if bound to another."""

    @abc.abstractmethod
    async def persist_pending(self, send: AuthenticatedSend, now_ms: int) -> PendingSend:
        """Write ``send`` as pending (durably) before anything is sent. The same send
        again returns the stored one (``confirmed`` when it is already
        committed); another send with its cmid is DuplicateClientMessageId."""

    @abc.abstractmethod
    async def mark_attempt(self, cmid: str, now_ms: int) -> None:
        """Count one hand-over of the pending send to the network (before it happens)."""

    @abc.abstractmethod
    async def park_pending(self, cmid: str, problem: str) -> None:
        """Stop retrying a pending send the server refused for good (kept)."""

    @abc.abstractmethod
    async def unpark_pending(self, cmid: str) -> bool:
        """Make a parked send pending again, its attempt count back at 0 (its first
        attempt's time is kept); False when there is none."""

    @abc.abstractmethod
    async def discard_pending(self, cmid: str) -> bool:
        """Drop a pending (usually parked) send; False when there is none."""

    @abc.abstractmethod
    async def next_sendable(self) -> PendingSend | None:
        """The oldest pending send that is not parked (one indexed read)."""

    @abc.abstractmethod
    async def pending(self) -> list[PendingSend]:
        """Every pending send (parked ones too), oldest first."""

    @abc.abstractmethod
    async def apply_mailbox_page(self, page: MailboxPage, cursor: MailboxCursor) -> Applied:
        """In one transaction: the page's messages (deduped by message id), the
        pending sends they confirm, the conversation projection, then ``cursor``."""

    @abc.abstractmethod
    async def resolve_pending(
        self, committed: CommittedMessage, content: MessageContent
    ) -> LocalMessage | None:
        """Turn the pending send of ``committed.cmid`` into its committed message
        (type and custom type kept); None when it was no longer pending."""

    @abc.abstractmethod
    async def apply_history(self, page: HistoryPage) -> Applied:
        """Write a history page's messages (deduped) and the pending sends they confirm."""

    @abc.abstractmethod
    async def cursor(self, lane: str) -> MailboxCursor | None:
        """The stored cursor of ``lane`` (lane, epoch, last applied seq), if any."""

    @abc.abstractmethod
    async def cursors(self) -> list[MailboxCursor]:
        """Every stored cursor."""

    @abc.abstractmethod
    async def find_own(self, sender: str, cmid: str) -> LocalMessage | None:
        """The stored message of (sender, cmid), if the store has it (any device,
        any content: compare its identity before taking it for a send)."""

    @abc.abstractmethod
    async def messages(
        self, conversation: str, *, limit: int = 50, before_seq: int = 0
    ) -> list[LocalMessage]:
        """The newest ``limit`` messages of a conversation below ``before_seq``
        (0: the newest), in ascending seq order."""

    @abc.abstractmethod
    async def max_seq(self, conversation: str) -> int:
        """The highest conversation seq stored (0: none)."""

    @abc.abstractmethod
    async def newest_read_ms(self, lane: str) -> int:
        """The newest server time of a message read from ``lane``'s mailbox (0: none)."""

    @abc.abstractmethod
    async def conversations(self) -> list[ConversationView]:
        """The conversation projection, by conversation id."""

    @abc.abstractmethod
    async def begin_rebuild(
        self,
        expired: ExpiredCursor,
        listed: Sequence[ConversationSummary],
        floors: Sequence[tuple[str, int]],
        now_ms: int,
    ) -> None:
        """Record that ``expired.lane`` is rebuilding, store the authoritative
        conversation list, and a backfill (conversation, floor seq) per target.

        Pending sends and messages stay. A rebuild resumed with the same expiry
        keeps the backfill progress made so far; another expiry starts every
        backfill again from the newest message (the floors are kept)."""

    @abc.abstractmethod
    async def rebuilding(self) -> list[ExpiredCursor]:
        """Rebuilds begun and not finished (a crash in between leaves one)."""

    @abc.abstractmethod
    async def backfills(self, lane: str) -> list[Backfill]:
        """The backfills of a rebuilding lane, by conversation."""

    @abc.abstractmethod
    async def apply_backfill(self, progress: Backfill, page: HistoryPage) -> Applied:
        """``apply_history`` of one backfill page and the backfill's new progress,
        in one transaction."""

    @abc.abstractmethod
    async def finish_rebuild(self, cursor: MailboxCursor) -> None:
        """Store the lane's new cursor and end its rebuild (and backfills), in one
        transaction."""

    @abc.abstractmethod
    async def reset_for_rebuild(self, reason: str) -> ResetReport:
        """Drop cursors and every rebuildable table together; keep pending sends."""

    @abc.abstractmethod
    async def repair(self, reason: str) -> ResetReport:
        """Reset a store found damaged while in use, as a reset on open does (the
        pending sends that can be read are kept, the rest is dropped)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the store; an open transaction is rolled back."""
