"""Named fault points of the client runtime, for tests and the client campaign.

An armed point raises ``ClientCrash`` when reached; the runtime then stops
where it is, as if the process had died there: the open local transaction
(if any) is rolled back, nothing else is written, and the host drops the
runtime and opens a new one on the same local store. Disarmed, a check costs
one dict test.

============  ==================================================================
point         where the runtime stops
============  ==================================================================
C-CLIENT-01   after a send was persisted as pending, before anything went out
C-CLIENT-02   after a send's attempt was counted, before its Commit went out
C-CLIENT-03   after the server answered a Commit, before the ACK was applied
C-CLIENT-04   inside a mailbox batch's transaction, after its messages were
              written, before the cursor (the transaction is rolled back)
C-CLIENT-05   after a mailbox batch committed, before its events were emitted
C-CLIENT-06   after ResumeExisting found a pending send, before it was resolved
C-CLIENT-07   during a REBUILD, after a conversation was backfilled, before
              ``finish_rebuild``
============  ==================================================================
"""

from __future__ import annotations

import enum
from collections import Counter


class ClientPoint(enum.StrEnum):
    AFTER_PERSIST = "C-CLIENT-01"
    ATTEMPT_BEFORE_SEND = "C-CLIENT-02"
    SENT_BEFORE_ACK = "C-CLIENT-03"
    MID_BATCH = "C-CLIENT-04"
    AFTER_BATCH = "C-CLIENT-05"
    RESUMED_BEFORE_RESOLVE = "C-CLIENT-06"
    MID_REBUILD = "C-CLIENT-07"


class ClientCrash(Exception):
    """Raised at an armed client fault point: the client "died" right there.

    Not a ClientRuntimeError: nothing in the runtime handles it as an error.
    """

    def __init__(self, point: ClientPoint) -> None:
        super().__init__(f"injected client crash at {point.value}")
        self.point = point


class ClientFaults:
    """Arms points for a number of hits; counts what fired."""

    def __init__(self) -> None:
        self._armed: dict[ClientPoint, int] = {}
        self.fired: Counter[ClientPoint] = Counter()

    def arm(self, point: ClientPoint, times: int = 1) -> None:
        self._armed[point] = self._armed.get(point, 0) + times

    def disarm_all(self) -> None:
        self._armed.clear()

    @property
    def armed(self) -> bool:
        return bool(self._armed)

    def check(self, point: ClientPoint) -> None:
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
        raise ClientCrash(point)
