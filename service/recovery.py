"""The background recovery loop that every replica runs.

Every ``interval`` (jittered by +-20% so replicas do not march in step) it
asks the committer to finish intents older than ``grace``, in batches of
``batch`` and at most ``max_batches`` batches per run, so one run is bounded
in work. Any number of replicas may do this at once: every step is
conditional and converges. It logs counts only.
"""

from __future__ import annotations

import asyncio
import logging
import random

from service.domain.committer import MessageCommitter
from service.domain.ports import Clock

log = logging.getLogger(__name__)

JITTER = 0.2


class RecoveryLoop:
    """Calls ``recover_due`` periodically until stopped."""

    def __init__(
        self,
        committer: MessageCommitter,
        clock: Clock,
        *,
        interval_s: float,
        grace_s: float,
        batch: int,
        max_batches: int = 10,
        rng: random.Random | None = None,
    ) -> None:
        self._committer = committer
        self._clock = clock
        self._interval_s = interval_s
        self._grace_ms = int(grace_s * 1000)
        self._batch = batch
        self._max_batches = max_batches
        self._rng = rng or random.Random()

    async def run_once(self) -> int:
        """One run: batches until one comes back short; returns intents committed."""
        total = 0
        for _ in range(self._max_batches):
            older_than = self._clock.now_ms() - self._grace_ms
            done = await self._committer.recover_due(older_than, self._batch)
            total += done
            if done < self._batch:
                break
        if total:
            log.info("recovery: %d unfinished intents committed", total)
        return total

    def next_delay(self) -> float:
        return self._interval_s * self._rng.uniform(1 - JITTER, 1 + JITTER)

    async def run(self, stop: asyncio.Event) -> None:
        """Run every (jittered) interval until ``stop`` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.next_delay())
            except TimeoutError:
                try:
                    await self.run_once()
                except Exception as exc:  # the loop outlives one failed run
                    log.warning("recovery run failed: %s", type(exc).__name__)
