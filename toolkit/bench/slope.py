"""The sustained phase's slope: the commit rate of its last tenth against its first.

A phase of ``--sustained`` fresh commits (100,000 by default) runs with the
relay delivering them (inside ``serve`` on memory, a ``message-committer
relay`` process beside the server on Redis and Scylla), long enough for any
cost that grows with what was delivered before to show. Each tenth's rate is
its commits over the time between its first and its last completion, so the
figure does not depend on how the phase started. Only the commits made while
every client process was still sending count: the processes split the count,
and one that finishes first leaves fewer streams to the other, which would
read as a slowdown of the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SHARE = 0.1
"""The part of the commits at each end whose rates are compared."""
MIN_COMMITS = 20
"""Below this, a tenth is too few completions for a rate."""


@dataclass(frozen=True, slots=True)
class Slope:
    commits: int
    first_per_s: float
    """Commits/s over the first tenth of the commits."""
    last_per_s: float
    """Commits/s over the last tenth."""
    ratio: float
    """last / first: 1.0 means no slowdown."""
    relay: str
    """Where the relay ran during the phase."""


def _rate(times: Sequence[float]) -> float:
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else 0.0


def measure(completions: Sequence[float], relay: str, until: float = 0.0) -> Slope | None:
    """The slope of a phase from its calls' completion times, those after ``until``
    (when the first client process stopped; 0: all) left out (None: too few)."""
    ordered = sorted(t for t in completions if not until or t <= until)
    count = len(ordered)
    tenth = int(count * SHARE)
    if count < MIN_COMMITS or tenth < 2:
        return None
    first = _rate(ordered[:tenth])
    last = _rate(ordered[-tenth:])
    return Slope(count, first, last, last / first if first > 0 else 0.0, relay)


def text(slope: Slope) -> str:
    return (
        f"sustained: {slope.commits} commits while every client sent, first {SHARE:.0%} {slope.first_per_s:.1f}/s,"
        f" last {SHARE:.0%} {slope.last_per_s:.1f}/s, last/first {slope.ratio:.2f}"
        f" (relay: {slope.relay})"
    )
