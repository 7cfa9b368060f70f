"""The memory backend: embedded, complete, and NOT durable.

Everything lives in one ``MemoryState`` held by the process; a restart of
the process loses it all. Each operation runs without awaiting in between,
so on one event loop every transition is atomic, including
``mark_published_and_committed``. Like Redis, it decides admission inside
reserve and finishes a fresh commit (put_record, the outbox append, the commit
mark) in one call, ``finish_pipelined``: two store calls per fresh commit, one
per replay (issue 27). Its clock plays the server's clock: it
decides expiry, windows and retention, as Redis's TIME does for Redis.

Layout (every map is keyed by tuples, so ids never collide across tenants):

* ``commits[(tenant, sender, cmid)]``: the intent until COMMITTED, then the
  compact form (identity digest, coordinates, publication) as a row;
* ``conversations[(tenant, conversation)]``: versioned members (per user the
  version intervals of ``service.domain.membership``, and the users in id
  order), the last allocated seq, history by seq, the first still-available
  seq and the seqs of unfinished intents (pinned against retention);
* ``queue``: the recovery queue, one entry per unfinished key (creation and
  due time, attempts, last problem, quarantined);
* ``outbox``: the entries not delivered yet, by position (the publish's
  number, from 1), and one queue per relay partition
  (``backends.memory.outbox_log``);
* ``delivery``: mailboxes, the per-user conversation index and the relay's
  partition bookkeeping (``backends.memory.delivery``, ``.partitions``).

What stays for long (history records, mailbox entries, committed keys) is
kept as flat tuples the garbage collector stops tracking
(``backends.memory.rows``): a full collection does not walk every message kept.

Retention is swept lazily at the start of each operation: committed records
past the idempotency window are dropped; history expires as a prefix (when a
record expires, every lower seq goes with it and ``available_from_seq`` moves
past it), but never past the lowest unfinished seq, so a commit that is
still being finished never loses its record.
"""

from __future__ import annotations

import logging
from typing import Literal

from backends.memory.delivery import (
    MemoryConversationIndex,
    MemoryHistoryRecords,
    MemoryMailboxStore,
)
from backends.memory.members import MemoryMembershipStore
from backends.memory.outbox import MemoryOutbox
from backends.memory.partitions import MemoryOutboxPartitions
from backends.memory.state import MemoryState
from backends.memory.store import MemoryMessageStore
from service.domain.delivery import DeliveryPorts, DeliverySettings, MailboxSettings
from service.domain.ports import Backend, Clock, StoreSettings, SystemClock

__all__ = ["NOT_DURABLE", "MemoryMessageStore", "MemoryState", "open_memory_backend"]

log = logging.getLogger(__name__)

NOT_DURABLE = "memory backend: not durable, every message is lost when the process stops"


def open_memory_backend(
    state: MemoryState | None = None,
    settings: StoreSettings | None = None,
    clock: Clock | None = None,
    identity_form: Literal["digest", "whole"] = "digest",
    mailbox: MailboxSettings | None = None,
    dead_letter_retention_ms: int | None = None,
) -> Backend:
    """A memory backend; pass the ``state`` of a closed one to "reopen" it."""
    state = state if state is not None else MemoryState()
    clock = clock or SystemClock()
    members = MemoryMembershipStore(state)
    store = MemoryMessageStore(
        state, members, (settings or StoreSettings()).validate(), clock, identity_form
    )
    delivery = DeliveryPorts(
        mailbox=MemoryMailboxStore(state, mailbox or MailboxSettings(), clock),
        partitions=MemoryOutboxPartitions(
            state, clock, dead_letter_retention_ms or DeliverySettings().dead_letter_retention_ms
        ),
        index=MemoryConversationIndex(state),
        records=MemoryHistoryRecords(state),
        shared=False,
    )
    return Backend(
        name="memory",
        store=store,
        membership=members,
        outbox=MemoryOutbox(state, clock),
        durable=False,
        delivery=delivery,
    )
