"""Seeded, replayable fault schedules.

A schedule is a list of faults, one after another, each with a start time, a target
and a duration, drawn from ``random.Random(seed)`` alone: the same seed, kinds and
duration give the same schedule (``--seed K`` replays it). The first faults of a
schedule walk through every available kind in a seeded order, so that even short
schedules fire each kind; later ones are drawn at random.
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


@dataclass(frozen=True, slots=True)
class Fault:
    """``kind`` on ``targets`` from ``at_s`` (seconds into the schedule) for ``for_s``."""

    kind: str
    targets: tuple[int, ...]
    at_s: float
    for_s: float

    def describe(self) -> str:
        where = ",".join(str(t) for t in self.targets)
        return f"{self.at_s:5.1f}s +{self.for_s:.1f}s {self.kind}[{where}]"


@dataclass(frozen=True, slots=True)
class FaultKind:
    """A kind of fault and how many things it may hit: ``pool`` targets to choose
    from, up to ``most`` at once (toxics may hit several node proxies)."""

    name: str
    pool: int
    most: int = 1


def make_schedule(
    seed: int, kinds: list[FaultKind], duration_s: float, max_fault_s: float = MAX_FAULT_S
) -> list[Fault]:
    """The faults of one schedule, in time order, all ending before ``duration_s``."""
    rng = random.Random(seed)
    order = rng.sample(kinds, len(kinds))
    faults: list[Fault] = []
    t = FIRST_FAULT_S
    while kinds:
        kind = order.pop(0) if order else rng.choice(kinds)
        length = rng.uniform(MIN_FAULT_S, max(MIN_FAULT_S, max_fault_s))
        if t + length > duration_s - END_MARGIN_S:
            length = duration_s - END_MARGIN_S - t
            if length < MIN_FAULT_S:
                break
        count = rng.randint(1, max(1, min(kind.most, kind.pool)))
        targets = tuple(sorted(rng.sample(range(kind.pool), count)))
        faults.append(Fault(kind.name, targets, round(t, 2), round(length, 2)))
        t += length + rng.uniform(MIN_GAP_S, MAX_GAP_S)
    return faults
