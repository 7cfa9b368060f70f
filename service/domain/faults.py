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

The outbox relay (``service.domain.relay_worker``) has points of its own,
between its durable steps:

=============  ==============================================================
point          where the relay stops
=============  ==============================================================
R-RELAY-01     after a lease with a new fencing token was taken, before the
               entries the previous holder left unsettled are reconciled
R-RELAY-02     after a batch was claimed (its entries are sending), before
               any mailbox write
R-RELAY-03     half-way through a batch's mailbox writes (some mailboxes
               written, the others not)
R-RELAY-04     after every mailbox write of a batch is durable, before the
               outbox positions are settled
R-RELAY-05     after a failed batch was settled as retryable, before it is
               tried again
R-RELAY-06     after a settle is durable in the outbox, before the relay goes on
=============  ==============================================================
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence


class FaultPoint(enum.StrEnum):
    AFTER_RESERVE = "M-COMMIT-01"
    AFTER_PUT_RECORD = "M-COMMIT-02"
    OUTBOX_SENT_UNACKED = "M-COMMIT-03"
    AFTER_OUTBOX_ACK = "M-COMMIT-04"
    BETWEEN_MARKS = "M-COMMIT-05"
    AFTER_COMMIT_BEFORE_ACK = "M-COMMIT-06"


class RelayPoint(enum.StrEnum):
    AFTER_TAKEOVER = "R-RELAY-01"
    AFTER_CLAIM = "R-RELAY-02"
    MID_FANOUT = "R-RELAY-03"
    AFTER_FANOUT = "R-RELAY-04"
    AFTER_RETRY_MARK = "R-RELAY-05"
    SETTLE_SENT_UNACKED = "R-RELAY-06"


Point = FaultPoint | RelayPoint


class InjectedCrash(Exception):
    """Raised at an armed fault point: the process "died" right there.

    Deliberately not a CommitError: nothing in the service catches it, just
    as nothing catches a real crash.
    """

    def __init__(self, point: Point) -> None:
        super().__init__(f"injected crash at {point.value}")
        self.point = point


class FaultPoints:
    """Arms points for a number of hits; counts what fired."""

    def __init__(self) -> None:
        self._armed: dict[Point, int] = {}
        self.fired: Counter[Point] = Counter()

    def arm(self, point: Point, times: int = 1) -> None:
        """Crash at ``point`` on its next ``times`` hits."""
        self._armed[point] = self._armed.get(point, 0) + times

    def first_armed(self, points: Sequence[Point]) -> Point | None:
        """The first of ``points`` (in their order) that is armed; None when none is.

        A backend that sends several steps in one round trip sends only those
        before this point, so the point still falls between two durable steps."""
        if not self._armed:
            return None
        return next((p for p in points if self._armed.get(p, 0) > 0), None)

    def disarm_all(self) -> None:
        self._armed.clear()

    def check(self, point: Point) -> None:
        """Called by the committer (or the relay) at ``point``; raises when armed."""
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
