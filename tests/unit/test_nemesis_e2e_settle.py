"""The e2e nemesis's settle: it waits while the fleet changes and gives up once
nothing has changed for its stall time (a sabotaged relay never delivers what it
skipped, and a caught run used to wait out the whole minute for it)."""

from __future__ import annotations

import time
from pathlib import Path

from toolkit.nemesis.e2e.devices import Fleet


class _Scripted(Fleet):
    """A fleet without device processes whose settle states come from a script."""

    def __init__(self, work: Path, states: list[tuple[bool, tuple[object, ...] | None]]) -> None:
        super().__init__(1, 0, [], work)
        self.states = states
        self.polls = 0

    async def _settle_state(self) -> tuple[bool, tuple[object, ...] | None]:
        self.polls += 1
        return self.states[min(self.polls, len(self.states)) - 1]


async def test_a_fleet_that_stops_changing_is_given_up_after_the_stall_time(
    tmp_path: Path,
) -> None:
    fleet = _Scripted(tmp_path, [(False, ("lacks m1",))])
    began = time.monotonic()
    assert await fleet.settle(timeout_s=30.0, stall_s=1.0) == -1.0
    assert time.monotonic() - began < 10.0
    assert 2 <= fleet.polls <= 6


async def test_a_fleet_still_changing_or_restarting_is_waited_for(tmp_path: Path) -> None:
    changing: list[tuple[bool, tuple[object, ...] | None]] = [
        (False, (f"lacks {n}",)) for n in range(4)
    ]
    restarting: list[tuple[bool, tuple[object, ...] | None]] = [(False, None)] * 4
    fleet = _Scripted(tmp_path, [*changing, *restarting, (True, ())])
    assert await fleet.settle(timeout_s=30.0, stall_s=1.0) > 0
    assert fleet.polls == 9
