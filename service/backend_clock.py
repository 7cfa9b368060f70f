""" "Now" from the backend's clock, for everything a replica decides by time.

On Redis every script decides expiry, idempotency windows, queue due times
and creation times by Redis's ``TIME``. What the replica still decides (the
recovery scan's cutoff, ``RecoverDue``'s default cutoff, the ACK's
``server_ts_ms`` and the message id's time) must come from the same clock,
or a replica 8 days ahead scans every backed-off intent as due at once and
quarantines a transiently failing one after 8 runs (80 s instead of 21 min).

``BackendClock`` is the replica's clock plus an offset measured against the
backend (per sample: backend time minus the midpoint of the request; the
sample with the shortest round trip wins, so the error is at most half of
it, well under a millisecond on a LAN). ``now_ms`` costs an addition; the
offset is measured before the server serves and again every ``interval``
(``run``). A failed measurement keeps the last offset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from service.domain.ports import Clock
from service.tasks import wait_event

log = logging.getLogger(__name__)

SAMPLES = 3
WARN_OFFSET_MS = 1_000


class BackendClock:
    """A Clock: the replica's, corrected to the backend's."""

    def __init__(self, replica: Clock, source: Callable[[], Awaitable[int]]) -> None:
        self._replica = replica
        self._source = source
        self.offset_ms = 0
        self.synced = False

    def now_ms(self) -> int:
        return self._replica.now_ms() + self.offset_ms

    def last_offset_ms(self) -> float | None:
        """The offset in use, None before the first measurement (for the metrics)."""
        return self.offset_ms if self.synced else None

    async def sync(self, samples: int = SAMPLES) -> int:
        """Measure the offset now; returns it (raises what the backend raised)."""
        best: tuple[float, int] | None = None
        for _ in range(max(1, samples)):
            started_ns = time.perf_counter_ns()
            before = self._replica.now_ms()
            server = await self._source()
            rtt_ms = (time.perf_counter_ns() - started_ns) / 1e6
            offset = round(server - (before + rtt_ms / 2))
            if best is None or rtt_ms < best[0]:
                best = (rtt_ms, offset)
        assert best is not None
        if abs(best[1]) > WARN_OFFSET_MS and abs(best[1] - self.offset_ms) > WARN_OFFSET_MS:
            log.warning(
                "this replica's clock is %+.3fs off the backend's: time is taken from it",
                -best[1] / 1000,
            )
        self.offset_ms, self.synced = best[1], True
        return best[1]

    async def try_sync(self) -> None:
        """``sync``, keeping the last offset when the backend does not answer."""
        try:
            await self.sync()
        except Exception as exc:
            log.warning("could not read the backend's clock: %s", type(exc).__name__)

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """Re-measure every ``interval_s`` until ``stop``."""
        while not await wait_event(stop, interval_s):
            await self.try_sync()
