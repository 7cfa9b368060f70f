"""The invariant checker of DESIGN §7, for tests and fault campaigns.

A scenario records every request it sent and every ACK it received in a
``Ledger``; ``check_invariants`` then reads the backend back (history
through the public ``history_page``, the outbox through ``read``, intents
through ``load_commit``) and returns one line per violation:

1. every ACK is in history exactly once, at its seq, with the whole committed
   record (sender, device, content, mentions, reply-to), and in the outbox at
   least once; an ACK below the conversation's ``available_from_seq`` is a
   violation unless its retention can have passed (``now >= server_ts +
   retention``);
2. no seq of a conversation is given to two messages;
3. every ACK for one CommitKey is identical;
4. a key reused with a different request is never ACKed;
5. (``check_recovered``) after recovery with faults off, no key the scenario
   ever sent is left unfinished (checked key by key, not through the recovery
   index that recovery itself uses), and the queue holds nothing due;
6. no history record exists without its intent (unless the idempotency window
   can have passed since it was committed: then its commit may have expired).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from service.domain.ids import CommitKey
from service.domain.model import (
    AuthenticatedSend,
    Committed,
    CommittedMessage,
    Direction,
    HistoryQuery,
    InProgress,
    MessageRecord,
)
from service.domain.ports import Backend

MAX_PAGES = 10_000


@dataclass
class Ledger:
    """What a scenario sent and what it was told."""

    readers: dict[tuple[str, str], str] = field(default_factory=dict)
    acks: defaultdict[CommitKey, list[tuple[AuthenticatedSend, CommittedMessage]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    sent: dict[CommitKey, str] = field(default_factory=dict)
    """Every key ever sent (whatever came back), with its conversation."""
    first_sent_ms: dict[CommitKey, int] = field(default_factory=dict)
    """When each key was first sent, by the backend's clock (a commit of the key
    happens after it); when unknown, the ACK's server timestamp stands in."""

    def conversation(self, tenant: str, conversation: str, reader: str) -> None:
        """Register a conversation and a member who may read its history."""
        self.readers[(tenant, conversation)] = reader

    def attempted(self, request: AuthenticatedSend, at_ms: int | None = None) -> None:
        """A send went out at ``at_ms`` (its outcome may be unknown)."""
        self.sent.setdefault(request.key, request.conversation)
        if at_ms is not None:
            self.first_sent_ms.setdefault(request.key, at_ms)

    def acked(self, request: AuthenticatedSend, message: CommittedMessage) -> None:
        self.attempted(request)
        self.acks[request.key].append((request, message))


@dataclass(frozen=True, slots=True)
class Retention:
    """What the checker needs to tell an expired record from a lost one."""

    now_ms: int
    history_retention_ms: int
    idempotency_window_ms: int = 0
    """A record may outlive its (compacted) commit, which expires after the window."""


async def read_history(
    backend: Backend, tenant: str, conversation: str, reader: str
) -> list[MessageRecord]:
    """Every record of a conversation, oldest first, through public paging."""
    return (await read_history_with_floor(backend, tenant, conversation, reader))[0]


async def read_history_with_floor(
    backend: Backend, tenant: str, conversation: str, reader: str
) -> tuple[list[MessageRecord], int]:
    """Every record and the ``available_from_seq`` of the last page."""
    records: list[MessageRecord] = []
    anchor, floor = 0, 1
    for _ in range(MAX_PAGES):
        page = await backend.store.history_page(
            HistoryQuery(tenant, conversation, reader, Direction.FORWARD, anchor, 200, 4 << 20)
        )
        records.extend(page.records)
        floor = page.available_from_seq
        if not page.next_anchor:
            return records, floor
        anchor = page.next_anchor
    raise RuntimeError("history did not end within the page bound")


async def read_outbox_ids(backend: Backend, tenants: set[str]) -> set[str]:
    """Message ids in the outbox for these tenants."""
    ids: set[str] = set()
    after = ""
    for _ in range(MAX_PAGES):
        page = await backend.outbox.read(after, 1000)
        if not page.entries:
            return ids
        ids.update(e.message_id for e in page.entries if e.tenant in tenants)
        after = page.next_after
    raise RuntimeError("outbox did not end within the page bound")


def _may_have_expired(sent_ms: int, retention: Retention | None) -> bool:
    """A commit happens after its first send, so its record cannot have expired
    before ``sent + retention``."""
    if retention is None:
        return False
    return retention.now_ms >= sent_ms + retention.history_retention_ms


def _same_record(record: MessageRecord, request: AuthenticatedSend) -> bool:
    return (
        record.sender == request.sender
        and record.device == request.device
        and record.cmid == request.cmid
        and record.content == request.content
        and record.mentions == request.mentions
        and record.reply_to == request.reply_to
    )


async def check_invariants(
    backend: Backend, ledger: Ledger, retention: Retention | None = None
) -> list[str]:
    """Violations of invariants 1-4 and 6; an empty list means all hold."""
    problems: list[str] = []
    histories: dict[tuple[str, str], tuple[list[MessageRecord], int]] = {
        conv: await read_history_with_floor(backend, conv[0], conv[1], reader)
        for conv, reader in ledger.readers.items()
    }
    outbox = await read_outbox_ids(backend, {t for t, _ in ledger.readers})
    for (tenant, conversation), (records, _) in histories.items():
        seqs = [r.seq for r in records]
        ids = [r.message_id for r in records]
        if len(set(seqs)) != len(seqs) or len(set(ids)) != len(ids):
            problems.append(f"2: {tenant}/{conversation} repeats a seq or a message id")
        for r in records:
            key = CommitKey(tenant, r.sender, r.cmid)
            sent_ms = ledger.first_sent_ms.get(key, r.server_ts_ms)
            if retention and retention.now_ms >= sent_ms + retention.idempotency_window_ms:
                continue  # its commit may have expired, as committed keys do
            loaded = await backend.store.load_commit(key, r.conversation)
            ok = (isinstance(loaded, Committed) and loaded.message.message_id == r.message_id) or (
                isinstance(loaded, InProgress) and loaded.intent.record.message_id == r.message_id
            )
            if not ok:
                problems.append(f"6: {tenant}/{conversation} seq {r.seq} has no intent")
    for key, acks in ledger.acks.items():
        first_request, first = acks[0]
        if any(message != first for _, message in acks):
            problems.append(f"3: {key} got different ACKs")
        if any(req.canonical_identity() != first_request.canonical_identity() for req, _ in acks):
            problems.append(f"4: {key} was ACKed for two different requests")
        found = histories.get((key.tenant, first.conversation))
        if found is None:
            problems.append(f"1: {key} acked in an unregistered conversation")
            continue
        history, floor = found
        at = [r for r in history if r.message_id == first.message_id]
        sent_ms = ledger.first_sent_ms.get(key, first.server_ts_ms)
        if not at and first.seq < floor and _may_have_expired(sent_ms, retention):
            continue  # expired by retention, as it may
        if len(at) != 1:
            problems.append(f"1: {key} appears {len(at)} times in history")
        elif at[0].seq != first.seq or not _same_record(at[0], first_request):
            problems.append(f"1: {key} is in history with another seq or record")
        if first.message_id not in outbox:
            problems.append(f"1: {key} is not in the outbox")
    return problems


async def check_recovered(
    backend: Backend, older_than_ms: int, ledger: Ledger | None = None
) -> list[str]:
    """Invariant 5: nothing unfinished is left: no key the ledger sent is still in
    progress, and the queue has nothing due before the bound."""
    problems = []
    for key, conversation in (ledger.sent if ledger else {}).items():
        loaded = await backend.store.load_commit(key, conversation)
        if isinstance(loaded, InProgress):
            problems.append(f"5: {key} still {loaded.intent.state.value} after recovery")
    for item in await backend.store.scan_recoverable_commits(older_than_ms, 10):
        if ledger is None or item.key not in ledger.sent:
            problems.append(f"5: {item.key} still unfinished after recovery")
    return problems
