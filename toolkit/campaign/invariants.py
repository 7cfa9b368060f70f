"""The invariant checker of DESIGN §7, for tests and fault campaigns.

A scenario records every request it sent and every ACK it received in a
``Ledger``; ``check_invariants`` then reads the backend back (history
through the public ``history_page``, the outbox through ``read``, intents
through ``load_commit``) and returns one line per violation:

1. every ACK is in history exactly once, at its seq, with the committed
   content, and in the outbox at least once;
2. no seq of a conversation is given to two messages;
3. every ACK for one CommitKey is identical;
4. a key reused with a different request is never ACKed;
5. (``check_recovered``) after recovery with faults off, nothing older than
   the bound is left unfinished;
6. no history record exists without its intent.
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

    def conversation(self, tenant: str, conversation: str, reader: str) -> None:
        """Register a conversation and a member who may read its history."""
        self.readers[(tenant, conversation)] = reader

    def acked(self, request: AuthenticatedSend, message: CommittedMessage) -> None:
        self.acks[request.key].append((request, message))


async def read_history(
    backend: Backend, tenant: str, conversation: str, reader: str
) -> list[MessageRecord]:
    """Every record of a conversation, oldest first, through public paging."""
    records: list[MessageRecord] = []
    anchor = 0
    for _ in range(MAX_PAGES):
        page = await backend.store.history_page(
            HistoryQuery(tenant, conversation, reader, Direction.FORWARD, anchor, 200, 4 << 20)
        )
        records.extend(page.records)
        if not page.next_anchor:
            return records
        anchor = page.next_anchor
    raise RuntimeError("history did not end within the page bound")


async def read_outbox_ids(backend: Backend, tenants: set[str]) -> set[str]:
    """Message ids in the outbox for these tenants."""
    ids: set[str] = set()
    after = ""
    for _ in range(MAX_PAGES):
        batch = await backend.outbox.read(after, 1000)
        if not batch:
            return ids
        ids.update(e.message_id for e in batch if e.tenant in tenants)
        after = batch[-1].publication.position
    raise RuntimeError("outbox did not end within the page bound")


async def check_invariants(backend: Backend, ledger: Ledger) -> list[str]:
    """Violations of invariants 1-4 and 6; an empty list means all hold."""
    problems: list[str] = []
    histories = {
        conv: await read_history(backend, conv[0], conv[1], reader)
        for conv, reader in ledger.readers.items()
    }
    outbox = await read_outbox_ids(backend, {t for t, _ in ledger.readers})
    for (tenant, conversation), records in histories.items():
        seqs = [r.seq for r in records]
        ids = [r.message_id for r in records]
        if len(set(seqs)) != len(seqs) or len(set(ids)) != len(ids):
            problems.append(f"2: {tenant}/{conversation} repeats a seq or a message id")
        for r in records:
            loaded = await backend.store.load_commit(
                CommitKey(tenant, r.sender, r.cmid), r.conversation
            )
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
        history = histories.get((key.tenant, first.conversation))
        if history is None:
            problems.append(f"1: {key} acked in an unregistered conversation")
            continue
        at = [r for r in history if r.message_id == first.message_id]
        if len(at) != 1:
            problems.append(f"1: {key} appears {len(at)} times in history")
        elif at[0].seq != first.seq or at[0].content != first_request.content:
            problems.append(f"1: {key} is in history with other seq or content")
        if first.message_id not in outbox:
            problems.append(f"1: {key} is not in the outbox")
    return problems


async def check_recovered(backend: Backend, older_than_ms: int) -> list[str]:
    """Invariant 5: nothing unfinished older than the bound remains."""
    left = await backend.store.scan_recoverable_commits(older_than_ms, 10)
    return [f"5: {intent.key} still {intent.state.value} after recovery" for intent in left]
