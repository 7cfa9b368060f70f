"""The sustained phase's slope figure (``toolkit.bench.slope``): pure arithmetic."""

from __future__ import annotations

import asyncio
import time

import pytest

from toolkit.bench.runner import sample_until
from toolkit.bench.slope import measure, shape


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


def test_cpu_per_commit_of_each_tenth_comes_from_the_samples() -> None:
    times = [n / 100 for n in range(1001)]  # 100 commits/s for 10 s
    # CPU: 1 ms per commit over the first 5 s, then 2 ms per commit
    samples = [(t / 2, 0.1 * t / 2 if t <= 10 else 0.5 + 0.2 * (t / 2 - 5)) for t in range(21)]
    slope = measure(times, "inside serve", cpu=samples)
    assert slope is not None and slope.cpu_ratio is not None
    assert slope.first_cpu_us == pytest.approx(1000)
    assert slope.last_cpu_us == pytest.approx(2000)
    assert slope.cpu_ratio == pytest.approx(0.5)
    unsampled = measure(times, "inside serve")
    assert unsampled is not None and unsampled.cpu_ratio is None


def test_every_tenth_has_its_rate_cpu_and_gc_so_a_run_shows_its_shape() -> None:
    # 1,000 commits at 100/s; 1 ms of CPU per commit, of which 0.25 ms GC in the
    # sixth tenth only (a full collection there)
    times = [n / 100 for n in range(1000)]
    cpu = [(t / 100, t / 1000) for t in range(0, 1001)]
    gc = [(t / 100, 0.0 if t < 500 else min(t - 500, 100) / 4000) for t in range(0, 1001)]
    slope = measure(times, "inside serve", cpu=cpu, gc=gc)
    assert slope is not None
    assert len(slope.tenths) == 10
    assert all(t.per_s == pytest.approx(100) for t in slope.tenths)
    assert all(t.cpu_us == pytest.approx(1000) for t in slope.tenths)
    assert [round(t.gc_us or 0) for t in slope.tenths] == [0, 0, 0, 0, 0, 250, 0, 0, 0, 0]
    assert "of which GC us/commit 0 0 0 0 0 250 0 0 0 0" in shape(slope)


async def test_the_cpu_sampler_takes_one_last_sample_after_the_phase_ends() -> None:
    # Before: the sampler stopped at its next wake-up without a sample, so the
    # phase's last completions came after the last sample and the last tenth had
    # no CPU figure ("server CPU per commit 1044 us -> n/a").
    stop = asyncio.Event()
    cpu: list[tuple[float, float]] = []
    gc: list[tuple[float, float]] = []
    reads = iter(range(1000))

    def read() -> tuple[float, float]:
        n = next(reads)
        return float(n), n / 10

    sampler = asyncio.create_task(sample_until(stop, read, cpu, gc, every_s=3600))
    await asyncio.sleep(0)  # the first sample, then a long wait
    last_completion = time.time()
    stop.set()
    await sampler
    assert len(cpu) == 2 and len(gc) == 2
    assert cpu[-1][0] >= last_completion and cpu[-1][1] == 1.0 and gc[-1][1] == 0.1
