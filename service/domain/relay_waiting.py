"""Entries that wait for a failing mailbox (DESIGN §10: a failing mailbox delays
only the entries addressed to it).

When appends to a mailbox fail, the entries addressed to it are charged an
attempt and wait; the mailbox is *sick* until the latest of their retry
times. New entries addressed to a sick mailbox wait too (not charged: they
were not tried), so a mailbox's entries reach it in order; every other entry
of the partition goes on at once. When a sick mailbox is due, the waiting
entries whose sick mailboxes are all due are tried again, oldest first,
except those sharing a mailbox with an older entry that must wait longer.
Pure bookkeeping of one relay's memory; the backends hold the retry marks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from service.domain.mailbox import Mailbox
from service.domain.relay import PartitionEntry


@dataclass
class _Wait:
    held: PartitionEntry
    mailboxes: frozenset[Mailbox]
    order: int


class Waiting:
    def __init__(self) -> None:
        self._entries: dict[str, _Wait] = {}
        self._sick: dict[Mailbox, int] = {}
        self._next = 0

    def __contains__(self, position: object) -> bool:
        return position in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def sick_due(self, mailboxes: Iterable[Mailbox]) -> int | None:
        """When the latest sick mailbox among ``mailboxes`` is due; None: none is sick."""
        dues = [self._sick[m] for m in mailboxes if m in self._sick]
        return max(dues) if dues else None

    def add(
        self, held: PartitionEntry, mailboxes: Iterable[Mailbox], due_ms: int,
        broken: Iterable[Mailbox] = (),
    ) -> None:  # fmt: skip
        """``held`` waits (again: it keeps its place); ``broken`` mailboxes are sick
        until ``due_ms`` at least."""
        known = self._entries.get(held.position)
        order = known.order if known is not None else self._next
        self._next += known is None
        self._entries[held.position] = _Wait(held, frozenset(mailboxes), order)
        for mailbox in broken:
            self._sick[mailbox] = max(self._sick.get(mailbox, 0), due_ms)

    def due(self, now_ms: int, limit: int) -> list[PartitionEntry]:
        """The waiting entries to try now (they stay listed until ``forget`` or ``add``)."""
        ready = {m for m, at in self._sick.items() if at <= now_ms}
        if not ready:
            return []
        chosen: list[PartitionEntry] = []
        blocked: set[Mailbox] = set()
        for wait in sorted(self._entries.values(), key=lambda w: w.order):
            sick = {m for m in wait.mailboxes if m in self._sick}
            if sick <= ready and not wait.mailboxes & blocked and len(chosen) < limit:
                chosen.append(wait.held)
            else:
                blocked |= wait.mailboxes
        return chosen

    def forget(self, positions: Iterable[str]) -> None:
        """These entries were settled (sent or dead-lettered); a mailbox no waiting
        entry is addressed to is not sick any more."""
        for position in positions:
            self._entries.pop(position, None)
        addressed = {m for w in self._entries.values() for m in w.mailboxes}
        self._sick = {m: at for m, at in self._sick.items() if m in addressed}

    def next_due_ms(self, now_ms: int) -> int:
        """How long until a sick mailbox is due (0: none is sick)."""
        return max(1, min(self._sick.values()) - now_ms) if self._sick else 0

    def clear(self) -> None:
        self._entries.clear()
        self._sick.clear()
