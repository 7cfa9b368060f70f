"""Typed events the runtime hands its host through ``next_event``.

Every event is emitted after the local transaction it reports has
committed, and reports only what that transaction changed: a message is
reported once (``MessagesAdded`` or, for this device's own send,
``SendConfirmed``), because the store adds each message id once.

The queue is bounded; when a host stops reading, the oldest events are
dropped and an ``EventsDropped`` tells it to re-read the local store.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Literal

from client.errors import RuntimeStopped
from client.model import LocalMessage, MailboxCursor, RebuildPlan
from client.state import ConnectionState
from service.domain.model import CommittedMessage

Via = Literal["ack", "mailbox", "history", "resume"]


@dataclass(frozen=True, slots=True)
class ConnectionChanged:
    state: ConnectionState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class MessagesAdded:
    """Messages newly written to the local store (never one already there)."""

    messages: tuple[LocalMessage, ...]
    source: Literal["mailbox", "history"]


@dataclass(frozen=True, slots=True)
class SendConfirmed:
    """A pending send is committed; ``message`` are its server coordinates.

    ``via``: ``ack`` (the Commit answer), ``mailbox`` or ``history`` (the
    message arrived before its ACK was seen), ``resume`` (ResumeExisting found
    it while reconciling after a reconnect).
    """

    cmid: str
    message: CommittedMessage
    via: Via


@dataclass(frozen=True, slots=True)
class SendFailed:
    """The server refused a send for good; it is parked (kept, not retried)."""

    cmid: str
    conversation: str
    error: str
    """The error class, e.g. ``NotAMember``."""
    message: str


@dataclass(frozen=True, slots=True)
class CursorExpired:
    """The server answered CURSOR_EXPIRED for a lane: a REBUILD follows."""

    lane: str
    epoch: int
    trim_watermark: int
    why: str


@dataclass(frozen=True, slots=True)
class RebuildStarted:
    plan: RebuildPlan


@dataclass(frozen=True, slots=True)
class RebuildFinished:
    cursor: MailboxCursor
    backfilled: int
    """Messages the backfill added to the local store."""


@dataclass(frozen=True, slots=True)
class LocalStoreReset:
    """The local store was unusable and was recreated: cursors and every
    rebuildable table were dropped, ``kept_pending`` pending sends kept."""

    reason: str
    kept_pending: int
    lost_pending: bool
    """True only when the old file was unreadable, so nothing could be kept."""


@dataclass(frozen=True, slots=True)
class EventsDropped:
    """The host did not read events fast enough; ``count`` were dropped."""

    count: int


ClientEvent = (
    ConnectionChanged
    | MessagesAdded
    | SendConfirmed
    | SendFailed
    | CursorExpired
    | RebuildStarted
    | RebuildFinished
    | LocalStoreReset
    | EventsDropped
)


class EventQueue:
    """A bounded FIFO of events for one reader."""

    def __init__(self, capacity: int) -> None:
        self._items: collections.deque[ClientEvent] = collections.deque()
        self._capacity = capacity
        self._dropped = 0
        self._closed = False
        self._ready = asyncio.Event()

    def close(self) -> None:
        """Readers get what is queued, then RuntimeStopped."""
        self._closed = True
        self._ready.set()

    def put(self, event: ClientEvent) -> None:
        if len(self._items) >= self._capacity:
            self._items.popleft()
            self._dropped += 1
        self._items.append(event)
        self._ready.set()

    async def get(self) -> ClientEvent:
        while True:
            if self._dropped:
                count, self._dropped = self._dropped, 0
                return EventsDropped(count)
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise RuntimeStopped("the runtime has stopped; no more events")
            self._ready.clear()
            await self._ready.wait()

    def pending(self) -> int:
        return len(self._items)
