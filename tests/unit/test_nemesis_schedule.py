"""Nemesis schedules are replayable from their seed, fit in their duration, walk
through every kind first, and hit only targets that exist."""

from __future__ import annotations

from toolkit.nemesis.schedule import END_MARGIN_S, FaultKind, make_schedule

KINDS = [FaultKind("kill-node", 3), FaultKind("latency", 3, most=3), FaultKind("kill-replica", 2)]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert make_schedule(5, KINDS, 60) == make_schedule(5, KINDS, 60)
    assert make_schedule(5, KINDS, 60) != make_schedule(6, KINDS, 60)


def test_faults_fit_in_time_and_targets_exist() -> None:
    for seed in range(50):
        faults = make_schedule(seed, KINDS, 40)
        pools = {k.name: k.pool for k in KINDS}
        end = 0.0
        for f in faults:
            assert f.at_s >= end  # one after another
            end = f.at_s + f.for_s
            assert all(0 <= t < pools[f.kind] for t in f.targets)
            assert len(set(f.targets)) == len(f.targets)
        assert end <= 40 - END_MARGIN_S + 1e-9


def test_every_kind_fires_first_when_there_is_time() -> None:
    for seed in range(20):
        first = make_schedule(seed, KINDS, 60)[: len(KINDS)]
        assert {f.kind for f in first} == {k.name for k in KINDS}
