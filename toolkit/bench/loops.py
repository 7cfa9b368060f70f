"""``bench --compare-loops``: the same phases on asyncio's event loop and on uvloop.

The loop in question is the bench process's: the in-process server and the
in-process floors run on it (client processes always use asyncio's default
loop, so both sides are driven alike). Each round of every phase runs once
per loop, alternating which loop goes first, so the two see the same
machine load; a ratio is the median of the per-round ratios
(``report.phase_ratio``), as for every other ratio of the bench.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from toolkit.bench.report import BackendReport, num, phase_ratio

LOOPS = ("asyncio", "uvloop")


def round_order(number: int) -> tuple[str, ...]:
    """Which loop runs first in round ``number`` (0-based): they take turns."""
    return LOOPS if number % 2 == 0 else LOOPS[::-1]


def ratios(by_loop: dict[str, BackendReport]) -> dict[str, float | None]:
    """uvloop/asyncio throughput per phase."""
    base, fast = by_loop["asyncio"], by_loop["uvloop"]
    return {name: phase_ratio(fast.phases.get(name), p) for name, p in base.phases.items()}


def comparison_text(backend: str, by_loop: dict[str, BackendReport]) -> list[str]:
    base, fast = by_loop["asyncio"], by_loop["uvloop"]
    rounds = max((len(r) for r in base.rounds.values()), default=0)
    head = (
        f"{'phase':<16}{'asyncio ops/s':>14}{'uvloop ops/s':>13}{'uv/asyncio':>11}"
        f"{'p50 ms a/uv':>15}{'p99 ms a/uv':>15}{'srv us/op a/uv':>16}"
    )
    lines = [
        f"== {backend}: server event loop, uvloop vs asyncio"
        f" ({rounds} rounds each, alternating) ==",
        head,
        "-" * len(head),
    ]
    r = ratios(by_loop)
    for name, a in base.phases.items():
        u = fast.phases.get(name)
        if u is None:
            continue
        lat = f"{a.latency_ms['p50']:.2f}/{u.latency_ms['p50']:.2f}"
        tail = f"{a.latency_ms['p99']:.2f}/{u.latency_ms['p99']:.2f}"
        cpu = (
            f"{a.server_cpu_us_per_op:.0f}/{u.server_cpu_us_per_op:.0f}"
            if a.server_cpu_measured
            else "n/a"
        )
        lines.append(
            f"{name:<16}{a.ops_per_s:>14.1f}{u.ops_per_s:>13.1f}{num(r[name]):>11}"
            f"{lat:>15}{tail:>15}{cpu:>16}"
        )
    return lines


def comparison_json(by_loop: dict[str, BackendReport]) -> dict[str, Any]:
    return {
        **{
            loop: {k: dataclasses.asdict(p) for k, p in report.phases.items()}
            for loop, report in by_loop.items()
        },
        "uvloop_over_asyncio": ratios(by_loop),
    }
