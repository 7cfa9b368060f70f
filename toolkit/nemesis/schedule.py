"""Seeded, replayable fault schedules.

A schedule is a list of faults, each with a start time, targets and a duration,
drawn from ``random.Random(seed)`` alone: the same seed, kinds and duration give the
same schedule (``--seed K`` replays it). The first faults of a schedule walk through
every available kind in a seeded order, one after another, so that even short
schedules fire each kind; later ones are drawn at random, and some of them
(``OVERLAP_P``) get a second fault that begins while they run (``overlap``): two
faults at once, always of different domains (storage and replicas), so that each
one's effect can still be observed alone. A kind may hit several targets at once
(``FaultKind.most``: two of three CQL nodes down).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FIRST_FAULT_S = 2.0
MIN_FAULT_S = 2.0
MAX_FAULT_S = 8.0
MIN_GAP_S = 1.0
MAX_GAP_S = 3.0
END_MARGIN_S = 1.0
OVERLAP_P = 0.35


@dataclass(frozen=True, slots=True)
class Fault:
    """``kind`` on ``targets`` from ``at_s`` (seconds into the schedule) for ``for_s``."""

    kind: str
    targets: tuple[int, ...]
    at_s: float
    for_s: float
    overlap: bool = False
    """Begins while the fault before it still runs (instead of after it)."""

    def describe(self) -> str:
        where = ",".join(str(t) for t in self.targets)
        both = " (overlapping)" if self.overlap else ""
        return f"{self.at_s:5.1f}s +{self.for_s:.1f}s {self.kind}[{where}]{both}"


@dataclass(frozen=True, slots=True)
class FaultKind:
    """A kind of fault and how many things it may hit: ``pool`` targets to choose
    from, up to ``most`` at once (toxics may hit several node proxies)."""

    name: str
    pool: int
    most: int = 1
    domain: str = "storage"
    """What it hits (storage, replica): overlapping faults have different domains."""


def make_schedule(
    seed: int, kinds: list[FaultKind], duration_s: float, max_fault_s: float = MAX_FAULT_S
) -> list[Fault]:
    """The faults of one schedule, in time order, all ending before ``duration_s``."""
    rng = random.Random(seed)
    order = rng.sample(kinds, len(kinds))
    faults: list[Fault] = []
    t = FIRST_FAULT_S
    end_s = duration_s - END_MARGIN_S
    while kinds:
        walking = bool(order)
        kind = order.pop(0) if order else rng.choice(kinds)
        length = rng.uniform(MIN_FAULT_S, max(MIN_FAULT_S, max_fault_s))
        if t + length > end_s:
            length = end_s - t
            if length < MIN_FAULT_S:
                break
        faults.append(_fault(rng, kind, t, length))
        ends = t + length
        others = [k for k in kinds if k.domain != kind.domain]
        if not walking and others and rng.random() < OVERLAP_P:
            at = t + rng.uniform(0.5, length / 2)
            second = min(rng.uniform(MIN_FAULT_S, max(MIN_FAULT_S, max_fault_s)), end_s - at)
            if second >= MIN_FAULT_S:
                faults.append(_fault(rng, rng.choice(others), at, second, overlap=True))
                ends = max(ends, at + second)
        t = ends + rng.uniform(MIN_GAP_S, MAX_GAP_S)
    return faults


def _fault(
    rng: random.Random, kind: FaultKind, at: float, length: float, overlap: bool = False
) -> Fault:
    count = rng.randint(1, max(1, min(kind.most, kind.pool)))
    targets = tuple(sorted(rng.sample(range(kind.pool), count)))
    return Fault(kind.name, targets, round(at, 2), round(length, 2), overlap)
