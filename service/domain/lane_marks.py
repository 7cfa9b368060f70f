"""High-water marks of mailbox lanes: noticing a lane whose head moved backwards.

Within an epoch a lane's head only grows (a trim moves the watermark, never
the head; ``new_epoch`` starts a higher epoch). So a lane found at an
``(epoch, head)`` below one seen before has lost entries: a Redis failover
to a replica that had not received them, a restore of an older snapshot.
Clients may have applied those seqs; if the lane went on in the same epoch,
later deliveries would reuse them and a client whose cursor the head passes
again would skip, in silence, what now sits there. The relay therefore keeps
the highest ``(epoch, head)`` each lane answered its appends with
(``LaneMarks``), sends it with the next append as a floor (``AppendRequest.
floor``), and a backend refuses, in the same atomic step that would write,
an append to a lane below its floor (``AppendOutcome.moved_back``); the relay
then starts the lane's next epoch and appends again (docs/delivery.md).

The marks live in the relay's memory, not next to the lane: what rolls a
lane back (a failover of its shard, a restore) rolls back every key of that
shard with it, and a relay survives a failover of the store it writes to.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from service.domain.mailbox import Mailbox

MAX_MARKS = 200_000
"""Lanes one relay remembers (least recently written forgotten first); a
forgotten lane is simply not checked until it is written again."""


@dataclass(frozen=True, slots=True, order=True)
class LaneMark:
    """A lane's ``(epoch, head)`` as someone saw it; ordered as a pair."""

    epoch: int
    head: int


def moved_back(floor: LaneMark | None, epoch: int, head: int) -> bool:
    """True when a lane now at ``(epoch, head)`` is below ``floor``: an older epoch,
    or the same epoch with a lower head (it lost entries that were seen)."""
    return floor is not None and (epoch, head) < (floor.epoch, floor.head)


def next_epoch(current: int, floor: LaneMark | None) -> int:
    """The epoch a restart after a roll-back takes: above the lane's own and above
    every epoch seen, so no (epoch, seq) a client held can come back."""
    return max(current, floor.epoch if floor is not None else 0) + 1


class LaneMarks:
    """The highest ``(epoch, head)`` seen per lane, bounded (least recent dropped)."""

    def __init__(self, limit: int = MAX_MARKS) -> None:
        if limit <= 0:
            raise ValueError("the number of lane marks must be positive")
        self._limit = limit
        self._marks: OrderedDict[Mailbox, LaneMark] = OrderedDict()

    def __len__(self) -> int:
        return len(self._marks)

    def get(self, mailbox: Mailbox) -> LaneMark | None:
        return self._marks.get(mailbox)

    def saw(self, mailbox: Mailbox, epoch: int, head: int) -> None:
        """Raise the lane's mark to ``(epoch, head)`` (a lower pair changes nothing)."""
        seen = LaneMark(epoch, head)
        old = self._marks.get(mailbox)
        if old is None or seen > old:
            self._marks[mailbox] = seen
        self._marks.move_to_end(mailbox)
        while len(self._marks) > self._limit:
            self._marks.popitem(last=False)

    def restarted(self, mailbox: Mailbox, epoch: int) -> None:
        """The lane was restarted at ``epoch`` (empty): its mark is that, not the
        pair it fell below."""
        self._marks[mailbox] = LaneMark(epoch, 0)
        self._marks.move_to_end(mailbox)
        while len(self._marks) > self._limit:
            self._marks.popitem(last=False)


__all__ = ["MAX_MARKS", "LaneMark", "LaneMarks", "moved_back", "next_epoch"]
