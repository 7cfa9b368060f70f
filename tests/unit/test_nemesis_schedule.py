"""Nemesis schedules are replayable from their seed, fit in their duration, walk
through every kind first, hit only targets that exist, overlap only faults of
different domains, and take several targets at once (two of three nodes down)."""

from __future__ import annotations

from toolkit.nemesis.schedule import END_MARGIN_S, FaultKind, make_schedule

KINDS = [
    FaultKind("kill-node", 3, most=2),
    FaultKind("latency", 3, most=3),
    FaultKind("kill-replica", 2, domain="replica"),
    FaultKind("clock-offset", 2, domain="replica"),
]
DOMAINS = {k.name: k.domain for k in KINDS}


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert make_schedule(5, KINDS, 60) == make_schedule(5, KINDS, 60)
    assert make_schedule(5, KINDS, 60) != make_schedule(6, KINDS, 60)


def test_faults_fit_in_time_and_targets_exist_and_only_other_domains_overlap() -> None:
    for seed in range(50):
        faults = make_schedule(seed, KINDS, 40)
        pools = {k.name: k.pool for k in KINDS}
        end = 0.0
        previous = faults[0]
        for f in faults:
            if f.overlap:  # begins while the one before runs, never on the same things
                assert previous.at_s < f.at_s < previous.at_s + previous.for_s
                assert DOMAINS[f.kind] != DOMAINS[previous.kind]
            else:
                assert f.at_s >= end  # after everything before it
            end = max(end, f.at_s + f.for_s)
            previous = f
            assert all(0 <= t < pools[f.kind] for t in f.targets)
            assert len(set(f.targets)) == len(f.targets)
        assert end <= 40 - END_MARGIN_S + 1e-9


def test_every_kind_fires_first_when_there_is_time() -> None:
    for seed in range(20):
        first = make_schedule(seed, KINDS, 60)[: len(KINDS)]
        assert {f.kind for f in first} == {k.name for k in KINDS}
        assert not any(f.overlap for f in first)


def test_schedules_hold_overlapping_faults_and_two_nodes_down_at_once() -> None:
    faults = [f for seed in range(30) for f in make_schedule(seed, KINDS, 90)]
    assert any(f.overlap for f in faults)
    assert any(f.kind == "kill-node" and len(f.targets) == 2 for f in faults)
