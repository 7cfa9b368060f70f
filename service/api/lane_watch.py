"""One watcher of lane heads per process, for every Subscribe stream (DESIGN §10).

Each stream used to read the state of all its lanes every poll interval: N
idle subscribers, N reads a second. ``LaneWatch`` reads the state of every
lane some stream watches once per interval, in calls of ``CHUNK`` lanes, and
wakes the streams whose lanes changed (an ``asyncio.Event`` each); a stream
then compares what it sent with ``state(lane)``. A lane nobody watches any
more is forgotten. The poller runs while some stream watches and ends with
the server (``stopping``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from service.domain.delivery import MailboxStore
from service.domain.errors import StoreError
from service.domain.mailbox import LaneState, Mailbox
from service.tasks import wait_event

log = logging.getLogger(__name__)

CHUNK = 1000
"""Lanes read per ``lane_state`` call."""


class LaneWatch:
    def __init__(self, mailbox: MailboxStore, interval_s: float, stopping: asyncio.Event) -> None:
        self._mailbox = mailbox
        self._interval_s = interval_s
        self._stopping = stopping
        self._watchers: dict[Mailbox, set[asyncio.Event]] = {}
        self._states: dict[Mailbox, LaneState] = {}
        self._task: asyncio.Task[None] | None = None
        self.reads = 0
        """``lane_state`` calls the poller made (for tests and the bench)."""

    def watch(
        self, mailboxes: Sequence[Mailbox], states: Sequence[LaneState], wake: asyncio.Event
    ) -> None:
        """``wake`` is set whenever one of ``mailboxes`` changes from now on; ``states``
        are what the stream read itself (the first hints)."""
        for mailbox, state in zip(mailboxes, states, strict=True):
            self._watchers.setdefault(mailbox, set()).add(wake)
            self._states.setdefault(mailbox, state)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="lane-watch")

    def unwatch(self, mailboxes: Sequence[Mailbox], wake: asyncio.Event) -> None:
        for mailbox in mailboxes:
            waiting = self._watchers.get(mailbox)
            if waiting is None:
                continue
            waiting.discard(wake)
            if not waiting:
                del self._watchers[mailbox]
                self._states.pop(mailbox, None)

    def state(self, mailbox: Mailbox) -> LaneState | None:
        return self._states.get(mailbox)

    @property
    def lanes(self) -> int:
        return len(self._watchers)

    async def _run(self) -> None:
        while self._watchers and not self._stopping.is_set():
            await wait_event(self._stopping, self._interval_s)
            lanes = list(self._watchers)
            for start in range(0, len(lanes), CHUNK):
                chunk = lanes[start : start + CHUNK]
                try:
                    self.reads += 1
                    states = await self._mailbox.lane_state(chunk)
                except StoreError as exc:  # the streams keep their last states; next round
                    log.warning("subscribe: reading lane heads failed: %s", type(exc).__name__)
                    break
                for mailbox, state in zip(chunk, states, strict=True):
                    if mailbox in self._watchers and self._states.get(mailbox) != state:
                        self._states[mailbox] = state
                        for wake in self._watchers[mailbox]:
                            wake.set()
        for waiting in self._watchers.values():  # stopping: every stream looks and ends
            for wake in waiting:
                wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
