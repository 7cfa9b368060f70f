"""What one store instance knows is stored, so a later step need not re-read it.

Each commit step is a conditional write whose condition checks the stored
state (docs/scylla.md), so re-reading the intent before each step only
re-proves what the caller already holds. Reserve writes the intent, a load or
a scan reads it, ``put_record`` writes its record: this store remembers that
(``KnownIntents``), and a step handed exactly that intent (same key, record,
identity, delivery and creation time) skips the read. Anything else, a
forged or stale intent or one this replica never saw, is read and checked
as before.

Nothing here is needed for correctness: a miss (another replica, a restart,
an evicted entry) costs the read it saves. What a hit stands for is durable:
the intent was written by an applied conditional write or read back, and the
record was acknowledged by history; a later change of the stored intent
(committed, or reserved anew after its window) makes the next conditional
write refuse, and the refusal is re-read at serial consistency.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from service.domain.ids import CommitKey
from service.domain.model import CommitIntent, OutboxPublication

CAPACITY = 50_000
"""Intents remembered (a few hundred bytes each): far more than are in flight."""


@dataclass(slots=True)
class Known:
    """One intent as this store last knew it."""

    intent: CommitIntent
    recorded: bool
    """History holds its record (written here, or read back)."""
    due_ms: int | None = None
    """Its recovery entry's due time, when a failed attempt moved it."""
    quarantined: bool = False


def same_intent(a: CommitIntent, b: CommitIntent) -> bool:
    return (
        a.key == b.key
        and a.record == b.record
        and a.identity == b.identity
        and a.delivery == b.delivery
        and a.created_at_ms == b.created_at_ms
    )


class KnownIntents:
    """A bounded map of CommitKey → Known (least recently used goes first)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._known: OrderedDict[CommitKey, Known] = OrderedDict()
        self._capacity = capacity

    def remember(
        self,
        intent: CommitIntent,
        *,
        recorded: bool,
        due_ms: int | None = None,
        quarantined: bool = False,
    ) -> Known:
        known = Known(intent, recorded, due_ms, quarantined)
        self._known[intent.key] = known
        self._known.move_to_end(intent.key)
        if len(self._known) > self._capacity:
            self._known.popitem(last=False)
        return known

    def get(self, intent: CommitIntent) -> Known | None:
        """What is known of exactly this intent, or None."""
        known = self._known.get(intent.key)
        if known is None or not same_intent(known.intent, intent):
            return None
        return known

    def published(self, known: Known, publication: OutboxPublication) -> None:
        known.intent = known.intent.advanced(known.intent.state, publication)

    def forget(self, key: CommitKey) -> None:
        self._known.pop(key, None)
