"""Mailboxes: lanes, epochs, cursors and Sync pages (DESIGN §10, seed 001).

A *mailbox* is one append-only log owned by either a user (its lane is
``"inbox"``: the messages of every conversation of that user that is small
enough to fan out) or a big conversation (its lane is ``"conversation:<id>"``,
shared by all its members). Addressed by ``Mailbox`` (tenant, kind, owner id),
so a user and a conversation with the same id never share one.

Each lane has an *epoch* (from 1) and a mailbox seq that is strictly
increasing and has no gaps within an epoch: the relay allocates seqs and
writes entries in one atomic step per mailbox. Entries come in *groups*:
what one relay append wrote to one mailbox (its ``group_id`` is the seq of
its first entry); a page never splits a group. Old entries are trimmed as a
prefix, always at a group boundary: ``trim_watermark`` is the highest seq
removed. A restore or a rebuild starts a new epoch (``new_epoch``), with the
old entries gone.

A cursor ``(lane, epoch, seq)`` continues only while ``epoch`` is the lane's
epoch and ``trim_watermark <= seq <= head``. Otherwise Sync answers
``CursorExpired`` (never an empty page): the client rebuilds and continues
from ``(lane, epoch, trim_watermark)``. Epoch 0 with seq 0 means "from the
start of whatever epoch the lane is in".

Every entry carries the membership version its message was frozen at (the
outbox entry's). A big conversation's lane is shared by its members, so a
Sync of it shows a reader only the entries ``readable`` by its membership
intervals: what was committed while it was a member, the rule an inbox
follows by construction (DESIGN §10, "One reading rule for every lane").

Pure rules only; backends store and read (``service.domain.delivery``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from service.domain import membership
from service.domain.errors import CursorExpired, InvalidRequest
from service.domain.ids import check_id
from service.domain.model import MessageRecord

INBOX = "inbox"
CONVERSATION_LANE_PREFIX = "conversation:"
MAX_GROUP_ENTRIES = 1000
"""Most entries one append (one group) may hold; the relay's batch is smaller."""
ENTRY_OVERHEAD_BYTES = 24
"""What an entry weighs on top of its record against a page's byte budget."""
MAX_GROUP_BYTES = 256 << 10
"""Most bytes one group may weigh (``split_group``), unless it is a single entry:
well inside a Sync page (1 MiB by default) and the 4 MiB gRPC limit. One entry
is bounded by the commit limits (a 64 KiB inline body, ids, 100 mentions: under
80 KiB), so it always fits a group of its own."""
MAX_PAGE_BYTES = 3 << 20
"""Most bytes a page is filled to, whatever ``max_bytes`` asks: the byte estimate
leaves out the protobuf framing (tens of bytes an entry, at most 1,000 entries a
page), which must still fit the 4 MiB gRPC send limit."""

DEFAULT_SYNC_LIMIT = 100
MAX_SYNC_LIMIT = 1000
DEFAULT_SYNC_BYTES = 1 << 20
MIN_SYNC_BYTES = 1024
MAX_SYNC_BYTES = 4 << 20
UNKNOWN_VERSION = 0
"""The membership version of an entry that does not know its own: written before
entries carried one, or for a release-1 outbox entry (recipients inline, no
version). Such an entry is ``readable`` by the conversation's members now, the
rule every conversation lane followed before."""


class OwnerKind(enum.StrEnum):
    """Who owns a mailbox: a user (lane ``inbox``) or a big conversation."""

    USER = "u"
    CONVERSATION = "c"


@dataclass(frozen=True, slots=True)
class Mailbox:
    """One mailbox: a tenant, an owner kind and the owner's id."""

    tenant: str
    kind: OwnerKind
    owner: str
    _hash: int = field(init=False, repr=False, compare=False)
    """The fields' hash, computed once: a relay step looks a mailbox up about ten
    times per append (lanes, marks, groups), and the generated ``__hash__``
    builds and hashes a tuple each time (issue 27)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.tenant, self.kind, self.owner)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def inbox(cls, tenant: str, user: str) -> Mailbox:
        return cls(tenant, OwnerKind.USER, user)

    @classmethod
    def conversation(cls, tenant: str, conversation: str) -> Mailbox:
        return cls(tenant, OwnerKind.CONVERSATION, conversation)

    @property
    def lane(self) -> str:
        """The lane name clients see."""
        if self.kind is OwnerKind.USER:
            return INBOX
        return conversation_lane(self.owner)


def conversation_lane(conversation: str) -> str:
    return CONVERSATION_LANE_PREFIX + conversation


def parse_lane(lane: str) -> str | None:
    """The conversation of a ``conversation:<id>`` lane, None for ``inbox``;
    InvalidRequest for anything else."""
    if lane == INBOX:
        return None
    if lane.startswith(CONVERSATION_LANE_PREFIX):
        return check_id("cursor.lane conversation", lane[len(CONVERSATION_LANE_PREFIX) :])
    raise InvalidRequest('cursor.lane must be "inbox" or "conversation:<conversation id>"')


MAX_CURSOR_VALUE = 2**63 - 1
"""The highest epoch or seq a cursor may name (the protocol's fields are uint64)."""


@dataclass(frozen=True, slots=True)
class MailboxCursor:
    """Where a client stands in one lane: the last seq it applied in ``epoch``."""

    lane: str = INBOX
    epoch: int = 0
    seq: int = 0

    def validate(self) -> MailboxCursor:
        parse_lane(self.lane)
        if self.epoch < 0 or self.seq < 0:
            raise InvalidRequest("cursor epoch and seq must not be negative")
        if self.epoch > MAX_CURSOR_VALUE or self.seq > MAX_CURSOR_VALUE:
            # no lane gets there, and the Scylla backend's bigint columns cannot
            # hold it: the query would fail to encode instead of answering
            raise InvalidRequest("cursor epoch and seq must be below 2^63: use one Sync returned")
        if self.epoch == 0 and self.seq != 0:
            raise InvalidRequest("a cursor of epoch 0 (from the start) must have seq 0")
        return self


@dataclass(frozen=True, slots=True)
class MailboxItem:
    """What the relay appends: one committed message (deduped by its id) and the
    membership version its delivery was frozen at (``UNKNOWN_VERSION``: none)."""

    record: MessageRecord
    membership_version: int = UNKNOWN_VERSION
    _size: int = field(default=-1, init=False, repr=False, compare=False)

    @property
    def message_id(self) -> str:
        return self.record.message_id

    def size_bytes(self) -> int:
        """What its entry will weigh (``MailboxEntry.size_bytes``). Weighed once, when
        first asked: the relay shares one item among a message's mailboxes and
        ``split_group`` weighs it for each (64 times a message of a 64-member group)."""
        if self._size < 0:
            object.__setattr__(self, "_size", ENTRY_OVERHEAD_BYTES + self.record.size_bytes())
        return self._size


@dataclass(frozen=True, slots=True)
class MailboxEntry:
    """One stored entry of a lane."""

    seq: int
    group_id: int
    record: MessageRecord
    appended_ms: int
    """When the relay appended it (the backend's clock): commit-to-mailbox
    latency is ``appended_ms - record.server_ts_ms``."""
    membership_version: int = UNKNOWN_VERSION
    """The membership version its message was frozen at (``readable``)."""

    def size_bytes(self) -> int:
        return ENTRY_OVERHEAD_BYTES + self.record.size_bytes()


@dataclass(frozen=True, slots=True)
class LaneState:
    """A lane's epoch, its last seq (``head``) and its trim watermark.

    A lane nobody has written yet reads as epoch 1, head 0, watermark 0.
    """

    epoch: int = 1
    head: int = 0
    watermark: int = 0


@dataclass(frozen=True, slots=True)
class LaneRead:
    """What a backend read for one Sync, atomically: the lane's state and the
    entries after the requested seq, in seq order, in complete groups (at
    least ``limit`` entries when the lane holds them, plus the rest of the
    last group)."""

    state: LaneState
    entries: tuple[MailboxEntry, ...]


@dataclass(frozen=True, slots=True)
class MailboxPage:
    """One Sync answer: complete groups after the cursor and the cursor to pass next."""

    lane: str
    entries: tuple[MailboxEntry, ...]
    next_cursor: MailboxCursor
    more: bool
    trim_watermark: int
    head: int
    withheld: tuple[tuple[int, int], ...] = ()
    """(seq, group id) of the entries the reader may not read (``readable``): sent
    as ``withheld`` events in their place, so the page stays gap-free."""


def check_cursor(lane: str, cursor: MailboxCursor, state: LaneState) -> int:
    """The seq to read after, or CursorExpired (see the module docs)."""
    if cursor.epoch not in (0, state.epoch):
        raise CursorExpired(lane, state.epoch, state.watermark, "the lane is in another epoch")
    if cursor.seq < state.watermark:
        raise CursorExpired(lane, state.epoch, state.watermark, "entries after it were trimmed")
    if cursor.seq > state.head:
        raise CursorExpired(
            lane, state.epoch, state.watermark, "it is ahead of what the lane holds"
        )
    return cursor.seq


def split_group(items: Sequence[MailboxItem]) -> list[tuple[MailboxItem, ...]]:
    """``items`` (for one mailbox, in order) cut at entry boundaries into groups of
    at most ``MAX_GROUP_ENTRIES`` entries and ``MAX_GROUP_BYTES`` bytes; an item
    bigger than that alone is a group of its own. The one rule for how big a
    group may be: the relay appends each part as one group."""
    if len(items) == 1:  # most relay steps give a mailbox one item: nothing to weigh
        return [(items[0],)]
    parts: list[tuple[MailboxItem, ...]] = []
    current: list[MailboxItem] = []
    used = 0
    for item in items:
        size = item.size_bytes()
        if current and (len(current) >= MAX_GROUP_ENTRIES or used + size > MAX_GROUP_BYTES):
            parts.append(tuple(current))
            current, used = [], 0
        current.append(item)
        used += size
    if current:
        parts.append(tuple(current))
    return parts


def groups(entries: Iterable[MailboxEntry]) -> list[list[MailboxEntry]]:
    """Consecutive entries with the same group id, in order."""
    result: list[list[MailboxEntry]] = []
    for entry in entries:
        if result and result[-1][0].group_id == entry.group_id:
            result[-1].append(entry)
        else:
            result.append([entry])
    return result


Reader = Sequence[int] | None
"""Who reads a lane: its membership intervals in the lane's conversation
(``service.domain.membership``), or None for the owner of an inbox (its own)."""


def readable(reader: Reader, membership_version: int) -> bool:
    """Whether ``reader`` sees an entry frozen at ``membership_version``: the one
    reading rule of every lane. An inbox's owner sees all of it (the relay wrote
    there only what was frozen for it); a conversation lane's reader, the
    entries of the versions it was a member at (joins, leaves, rejoins); an
    entry of ``UNKNOWN_VERSION``, while it is a member now."""
    if reader is None:
        return True
    if membership_version == UNKNOWN_VERSION:
        return membership.is_member(reader)
    return membership.member_at(reader, membership_version)


def build_page(
    lane: str,
    cursor: MailboxCursor,
    read: LaneRead,
    limit: int,
    max_bytes: int,
    reader: Reader = None,
) -> MailboxPage:
    """The page for ``cursor`` from what the backend read, as ``reader`` sees it.

    Whole groups only, while both the count and the byte budget (``max_bytes``,
    at most ``MAX_PAGE_BYTES``) allow; at least one group when there is one, even
    if it alone is over either (``split_group`` keeps a group within
    ``MAX_GROUP_BYTES``, or one entry). A group's entries the reader may not
    see (``readable``) are *withheld*: the page names their seqs and carries
    nothing of them, so the lane stays gap-free for the client (which checks
    it), they cost no bytes, and each counts as one event against ``limit``.
    """
    after = check_cursor(lane, cursor, read.state)
    max_bytes = min(max_bytes, MAX_PAGE_BYTES)
    taken: list[MailboxEntry] = []
    withheld: list[tuple[int, int]] = []
    used = 0
    last = after
    for group in groups(e for e in read.entries if e.seq > after):
        shown = [e for e in group if readable(reader, e.membership_version)]
        size = sum(e.size_bytes() for e in shown)
        events = len(taken) + len(withheld)
        if events and (events + len(group) > limit or used + size > max_bytes):
            break
        taken += shown
        if len(shown) < len(group):
            shown_seqs = {e.seq for e in shown}
            withheld += [(e.seq, e.group_id) for e in group if e.seq not in shown_seqs]
        used += size
        last = group[-1].seq
    return MailboxPage(
        lane=lane,
        entries=tuple(taken),
        next_cursor=MailboxCursor(lane, read.state.epoch, last),
        more=last < read.state.head,
        trim_watermark=read.state.watermark,
        head=read.state.head,
        withheld=tuple(withheld),
    )


def sync_limits(limit: int, max_bytes: int) -> tuple[int, int]:
    """The wire's 0-means-default resolved, or InvalidRequest."""
    limit = limit or DEFAULT_SYNC_LIMIT
    max_bytes = max_bytes or DEFAULT_SYNC_BYTES
    if not 1 <= limit <= MAX_SYNC_LIMIT:
        raise InvalidRequest(f"limit must be 1 to {MAX_SYNC_LIMIT} (0: {DEFAULT_SYNC_LIMIT})")
    if not MIN_SYNC_BYTES <= max_bytes <= MAX_SYNC_BYTES:
        raise InvalidRequest(f"max_bytes must be {MIN_SYNC_BYTES} to {MAX_SYNC_BYTES} (0: 1 MiB)")
    return limit, max_bytes


def new_items(items: Sequence[MailboxItem], present: Iterable[str]) -> list[MailboxItem]:
    """``items`` without those whose message id is in ``present`` or repeats an
    earlier item: what an append adds (the dedupe that makes delivery exactly once)."""
    seen = set(present)
    fresh = []
    for item in items:
        if item.message_id not in seen:
            seen.add(item.message_id)
            fresh.append(item)
    return fresh


def trim_cut(
    state: LaneState,
    group_ends: Sequence[tuple[int, int]],
    *,
    now_ms: int,
    retention_ms: int,
    max_entries: int,
) -> int:
    """The new watermark retention asks for (>= ``state.watermark``).

    ``group_ends`` are (last seq, appended ms) of the lane's groups above the
    watermark, in seq order. Everything appended at or before ``now -
    retention`` goes, and the oldest groups go until at most ``max_entries``
    remain, but never the newest group for the count (a group bigger than the
    bound is still delivered); a cut is always at the end of a group.
    """
    cut = state.watermark
    for end, appended in group_ends:
        too_old = appended <= now_ms - retention_ms
        too_many = state.head - cut > max_entries and end < state.head
        if not (too_old or too_many):
            break
        cut = end
    return cut


def dedupe_cut(
    dedupe_mark: int,
    watermark: int,
    group_ends: Sequence[tuple[int, int]],
    *,
    now_ms: int,
    window_ms: int,
) -> int:
    """The new dedupe mark (>= ``dedupe_mark``): the highest seq whose message id
    the lane forgets.

    A lane remembers the message id of every entry it holds and, after a trim
    (by count or by hand), of every trimmed entry whose group was appended less
    than ``window_ms`` ago: a redelivery within the window is still deduped
    (``too_old_to_deliver`` refuses the rest). ``group_ends`` are (last seq,
    appended ms) of the groups above ``dedupe_mark``, in seq order; the ids of
    whole groups at or below ``watermark`` appended at or before ``now -
    window`` go, oldest first.
    """
    cut = dedupe_mark
    for end, appended in group_ends:
        if end > watermark or appended > now_ms - window_ms:
            break
        cut = end
    return cut


MAX_REFUSAL_MARGIN_MS = 3_600_000
"""At most this much of the dedupe window is kept as the margin of
``too_old_to_deliver`` (a tenth of it when that is less)."""


def refusal_margin_ms(window_ms: int) -> int:
    """What ``too_old_to_deliver`` keeps back from the window: it covers the time
    between the relay's check and the append, and the skew between the clocks
    that stamp a record (commit) and a group (append) and that trim."""
    return min(MAX_REFUSAL_MARGIN_MS, window_ms // 10)


def too_old_to_deliver(server_ts_ms: int, *, now_ms: int, window_ms: int) -> bool:
    """True when a message committed at ``server_ts_ms`` must not be appended any
    more: a lane may have held it and forgotten its id (``dedupe_cut``), so an
    append could add it twice. A message younger than ``window - margin`` was
    appended (if ever) at or after its commit, so its id is still remembered."""
    return now_ms - server_ts_ms >= window_ms - refusal_margin_ms(window_ms)
