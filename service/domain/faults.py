"""Named fault points between durable steps (DESIGN §6).

Tests and the fault campaign arm a point to make the committer stop there as
if the process had crashed or the reply had been lost. Disarmed, a check is
one attribute test and one dict lookup on an empty dict.

=============  ==============================================================
point          where the committer stops
=============  ==============================================================
M-COMMIT-01    after reserve returned (intent durable, nothing recorded)
M-COMMIT-02    after put_record returned (record in history)
M-COMMIT-03    after the outbox call was sent, before its ack is seen
M-COMMIT-04    after the outbox's durable ack, before the store is marked
M-COMMIT-05    between mark_outbox_published and mark_committed (two-step path)
M-COMMIT-06    after COMMITTED, before the ACK reaches the caller
=============  ==============================================================
"""

from __future__ import annotations

import enum
from collections import Counter


class FaultPoint(enum.StrEnum):
    AFTER_RESERVE = "M-COMMIT-01"
    AFTER_PUT_RECORD = "M-COMMIT-02"
    OUTBOX_SENT_UNACKED = "M-COMMIT-03"
    AFTER_OUTBOX_ACK = "M-COMMIT-04"
    BETWEEN_MARKS = "M-COMMIT-05"
    AFTER_COMMIT_BEFORE_ACK = "M-COMMIT-06"


class InjectedCrash(Exception):
    """Raised at an armed fault point: the process "died" right there.

    Deliberately not a CommitError: nothing in the service catches it, just
    as nothing catches a real crash.
    """

    def __init__(self, point: FaultPoint) -> None:
        super().__init__(f"injected crash at {point.value}")
        self.point = point


class FaultPoints:
    """Arms points for a number of hits; counts what fired."""

    def __init__(self) -> None:
        self._armed: dict[FaultPoint, int] = {}
        self.fired: Counter[FaultPoint] = Counter()

    def arm(self, point: FaultPoint, times: int = 1) -> None:
        """Crash at ``point`` on its next ``times`` hits."""
        self._armed[point] = self._armed.get(point, 0) + times

    def disarm_all(self) -> None:
        self._armed.clear()

    def check(self, point: FaultPoint) -> None:
        """Called by the committer at ``point``; raises when armed."""
        if not self._armed:
            return
        left = self._armed.get(point, 0)
        if left <= 0:
            return
        if left == 1:
            del self._armed[point]
        else:
            self._armed[point] = left - 1
        self.fired[point] += 1
        raise InjectedCrash(point)
