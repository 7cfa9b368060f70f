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

On a shared machine the rates move with other processes' load; CPU per
commit hardly does. So the server's CPU (with the relay's: inside serve, or
the relay process's) is sampled over the phase, and each tenth also gets its
CPU per commit; ``cpu_ratio`` is first / last of those, the slope as CPU
sees it (1.0: the last commits cost what the first did). The time the
server spent in Python's cyclic garbage collector is sampled the same way
(in-process servers only), and every tenth's rate, CPU and GC per commit is
kept, so a run shows the shape of its slope and how much of it the
collector's full collections are.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

SHARE = 0.1
"""The part of the commits at each end whose rates are compared."""
MIN_COMMITS = 20
"""Below this, a tenth is too few completions for a rate."""


@dataclass(frozen=True, slots=True)
class Tenth:
    """One tenth of the sustained commits."""

    per_s: float
    cpu_us: float | None = None
    """Server (+ relay) CPU per commit (None: not sampled)."""
    gc_us: float | None = None
    """Of which the server's cyclic garbage collector (None: not sampled)."""


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
    first_cpu_us: float | None = None
    """Server (+ relay) CPU per commit over the first tenth (None: not sampled)."""
    last_cpu_us: float | None = None
    cpu_ratio: float | None = None
    """first_cpu_us / last_cpu_us: the slope from CPU per commit."""
    tenths: tuple[Tenth, ...] = ()
    """Every tenth of the commits in order, the first and last included."""


CpuSamples = Sequence[tuple[float, float]]
"""(``time.time()``, CPU or GC seconds of the server (and its relay) so far), in time order."""


def _cpu_at(samples: CpuSamples, when: float) -> float | None:
    """The CPU count at ``when``, interpolated between the samples around it."""
    times = [t for t, _ in samples]
    at = bisect.bisect_left(times, when)
    if at < len(samples) and times[at] == when:
        return samples[at][1]
    if at == 0 or at == len(samples):
        return None
    (t0, c0), (t1, c1) = samples[at - 1], samples[at]
    return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1


def _per_commit_us(samples: CpuSamples, times: Sequence[float]) -> float | None:
    start, end = _cpu_at(samples, times[0]), _cpu_at(samples, times[-1])
    if start is None or end is None:
        return None
    return (end - start) / (len(times) - 1) * 1e6


def _rate(times: Sequence[float]) -> float:
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else 0.0


def measure(
    completions: Sequence[float],
    relay: str,
    until: float = 0.0,
    cpu: CpuSamples = (),
    gc: CpuSamples = (),
) -> Slope | None:
    """The slope of a phase from its calls' completion times, those after ``until``
    (when the first client process stopped; 0: all) left out (None: too few).
    ``cpu`` and ``gc`` are samples of the CPU and GC seconds spent so far."""
    ordered = sorted(t for t in completions if not until or t <= until)
    count = len(ordered)
    tenth = int(count * SHARE)
    if count < MIN_COMMITS or tenth < 2:
        return None
    parts = [ordered[:tenth]]
    parts += [ordered[k * count // 10 : (k + 1) * count // 10] for k in range(1, 9)]
    parts.append(ordered[-tenth:])
    tenths = tuple(Tenth(_rate(p), _per_commit_us(cpu, p), _per_commit_us(gc, p)) for p in parts)
    head, tail = tenths[0], tenths[-1]
    first_cpu, last_cpu = head.cpu_us, tail.cpu_us
    cpu_ratio = first_cpu / last_cpu if first_cpu and last_cpu else None
    ratio = tail.per_s / head.per_s if head.per_s > 0 else 0.0
    return Slope(
        count, head.per_s, tail.per_s, ratio, relay, first_cpu, last_cpu, cpu_ratio, tenths
    )


def text(slope: Slope) -> str:
    return (
        f"sustained: {slope.commits} commits while every client sent,"
        f" first {SHARE:.0%} {slope.first_per_s:.1f}/s,"
        f" last {SHARE:.0%} {slope.last_per_s:.1f}/s, last/first {slope.ratio:.2f}"
        f" (relay: {slope.relay}); server CPU per commit"
        f" {_us(slope.first_cpu_us)} -> {_us(slope.last_cpu_us)},"
        f" first/last {'n/a' if slope.cpu_ratio is None else f'{slope.cpu_ratio:.2f}'}"
    )


def shape(slope: Slope) -> str:
    """Every tenth's rate, CPU and GC per commit, one line each."""
    rates = " ".join(f"{t.per_s:.0f}" for t in slope.tenths)
    lines = [f"sustained by tenth: commits/s {rates}"]
    for label, values in (
        ("server CPU us/commit", [t.cpu_us for t in slope.tenths]),
        ("of which GC us/commit", [t.gc_us for t in slope.tenths]),
    ):
        if all(v is not None for v in values):
            lines.append(f"sustained by tenth: {label} " + " ".join(f"{v:.0f}" for v in values))
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} us"
