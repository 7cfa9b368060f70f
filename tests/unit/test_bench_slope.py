"""The sustained phase's slope figure (``toolkit.bench.slope``): pure arithmetic."""

from __future__ import annotations

import pytest

from toolkit.bench.slope import measure


def test_a_steady_rate_has_a_slope_of_one() -> None:
    times = [n / 500 for n in range(1000)]  # 500/s throughout
    slope = measure(list(reversed(times)), "inside serve")  # any order: sorted first
    assert slope is not None
    assert slope.commits == 1000
    assert slope.first_per_s == pytest.approx(500)
    assert slope.last_per_s == pytest.approx(500)
    assert slope.ratio == pytest.approx(1.0)


def test_a_phase_that_slows_down_shows_it_in_its_last_tenth() -> None:
    fast = [n / 800 for n in range(500)]  # 800/s, then 200/s
    slow = [fast[-1] + (n + 1) / 200 for n in range(500)]
    slope = measure(fast + slow, "a relay process beside the server")
    assert slope is not None
    assert slope.first_per_s == pytest.approx(800)
    assert slope.last_per_s == pytest.approx(200)
    assert slope.ratio == pytest.approx(0.25)


def test_too_few_commits_have_no_slope() -> None:
    assert measure([0.1 * n for n in range(19)], "inside serve") is None
    assert measure([], "inside serve") is None


def test_commits_after_the_first_client_stopped_are_left_out() -> None:
    both = [n / 1000 for n in range(1000)]  # two processes: 1,000/s until t = 1
    alone = [1 + (n + 1) / 500 for n in range(300)]  # then one process alone: 500/s
    slope = measure(both + alone, "inside serve", until=both[-1])
    assert slope is not None
    assert slope.commits == 1000
    assert slope.ratio == pytest.approx(1.0)
