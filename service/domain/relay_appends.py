"""The mailbox writes of one relay step, with each lane's high-water mark as the
floor of its appends (``service.domain.lane_marks``; docs/delivery.md).

A lane found below its mark lost entries a reader may have applied (a failover
to a replica that had not received them, a restore); it starts its next epoch,
above every epoch seen, before anything more is written to it, and gets its
request again in that epoch, so no (epoch, seq) a client held is given out
twice. Every other lane's mark rises to what it answered, appends that were
applied but not replicated in time included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.domain.delivery import (
    AppendNotReplicated,
    AppendOutcome,
    AppendRequest,
    MailboxStore,
)
from service.domain.errors import LeaseLost, StoreError, StoreFenced
from service.domain.lane_marks import LaneMark, LaneMarks
from service.domain.mailbox import Mailbox
from service.domain.relay import Fence

_KINDS = {"u": "inbox", "c": "conversation"}


class LaneObserver(Protocol):
    def on_lane_moved_back(self, kind: str, seen: LaneMark, found: LaneMark, epoch: int) -> None:
        """A lane (``kind``: inbox or conversation) was found at ``found``, below the
        ``seen`` mark, and was restarted at ``epoch``."""


class Appends:
    """Appends under one fencing token, keeping ``marks`` up to date."""

    def __init__(
        self, mailbox: MailboxStore, fence: Fence, marks: LaneMarks, observer: LaneObserver
    ) -> None:
        self._mailbox = mailbox
        self._fence = fence
        self._marks = marks
        self._observer = observer

    async def write(
        self, requests: list[AppendRequest], broken: dict[Mailbox, str]
    ) -> list[AppendOutcome]:
        """The requests in order, one call per run in which no mailbox repeats (a
        backend writes the requests of one call independently, maybe at once). A
        failed call is made again one mailbox at a time, so that only the failing
        mailboxes go into ``broken``; their later requests are left out."""
        outcomes: list[AppendOutcome] = []
        start = 0
        while start < len(requests):
            run: list[AppendRequest] = []
            seen: set[Mailbox] = set()
            while start < len(requests) and requests[start].mailbox not in seen:
                seen.add(requests[start].mailbox)
                if requests[start].mailbox not in broken:
                    run.append(requests[start])
                start += 1
            outcomes += await self._run(run, broken)
        return outcomes

    async def _run(
        self, run: list[AppendRequest], broken: dict[Mailbox, str]
    ) -> list[AppendOutcome]:
        """The run with each lane's mark as its floor. A lane found below its mark
        (it lost entries: a failover, a restore) starts its next epoch and gets
        its request again; every other lane's mark rises to what it answered."""
        if not run:
            return []
        done = await self._append_calls([self._floored(r) for r in run], broken)
        fell = [(r, o) for r, o in done if o.moved_back]
        if fell:
            again = [r for r, o in fell if await self._restart(r, o, broken)]
            done = [p for p in done if not p[1].moved_back]
            for request, outcome in await self._append_calls(
                [self._floored(r) for r in again], broken
            ):
                if outcome.moved_back:  # below its fresh epoch at once: leave it for now
                    broken[request.mailbox] = "LaneMovedBack"
                else:
                    done.append((request, outcome))
        self._note(done)
        return [o for _, o in done]

    def _note(self, done: Sequence[tuple[AppendRequest, AppendOutcome]]) -> None:
        """Raise the marks of the lanes written to what they answered."""
        for request, outcome in done:
            if not (outcome.fenced or outcome.moved_back):
                self._marks.saw(request.mailbox, outcome.epoch, outcome.head)

    def _floored(self, request: AppendRequest) -> AppendRequest:
        return request.with_floor(self._marks.get(request.mailbox))

    async def _restart(
        self, request: AppendRequest, outcome: AppendOutcome, broken: dict[Mailbox, str]
    ) -> bool:
        """Start the next epoch of a lane that moved back (above every epoch seen), so
        every cursor into what it lost answers CURSOR_EXPIRED; False when that failed."""
        seen = request.floor or LaneMark(0, 0)
        try:
            state = await self._mailbox.new_epoch(request.mailbox, above=seen.epoch)
        except StoreError as exc:
            broken[request.mailbox] = type(exc).__name__
            return False
        self._marks.restarted(request.mailbox, state.epoch)
        found = LaneMark(outcome.epoch, outcome.head)
        self._observer.on_lane_moved_back(
            _KINDS.get(request.mailbox.kind.value, "lane"), seen, found, state.epoch
        )
        return True

    async def _append_calls(
        self, run: list[AppendRequest], broken: dict[Mailbox, str]
    ) -> list[tuple[AppendRequest, AppendOutcome]]:
        """One call for the run; when it fails, one call per request, so that only
        the failing mailboxes go into ``broken``. StoreFenced when one was fenced."""
        if not run:
            return []
        try:
            done = list(zip(run, await self._mailbox.append(run, self._fence), strict=True))
        except (LeaseLost, StoreFenced):
            raise
        except StoreError as exc:
            self._applied(run, exc)
            if len(run) == 1:
                broken[run[0].mailbox] = type(exc).__name__
                return []
            done = []
            for request in run:
                try:
                    one = await self._mailbox.append([request], self._fence)
                except (LeaseLost, StoreFenced):
                    raise
                except StoreError as alone:
                    self._applied([request], alone)
                    broken[request.mailbox] = type(alone).__name__
                else:
                    done += zip([request], one, strict=True)
        if any(o.fenced for _, o in done):
            raise StoreFenced("a mailbox has seen a newer fencing token of this partition")
        return done

    def _applied(self, run: list[AppendRequest], error: StoreError) -> None:
        """Appends that were applied but not replicated in time count for the marks:
        a reader may have seen them, so losing them later is a lane moving back."""
        if isinstance(error, AppendNotReplicated) and len(error.outcomes) == len(run):
            self._note(list(zip(run, error.outcomes, strict=True)))
