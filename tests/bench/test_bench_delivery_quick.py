"""Smoke test of ``message-committer bench-delivery --quick``: it completes on memory and
on Redis (the relay as a subprocess) and writes well-formed figures.

Figures are not asserted beyond their shape (the machine is shared and noisy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.bench.delivery import main

NUMBERS = ("p50_ms", "p99_ms", "fanout_s", "entries_per_s", "messages_per_s")


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_bench_delivery_quick_writes_every_figure(
    backend: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    out = tmp_path / "delivery.json"
    args = ["--backend", backend, "--quick", "--members", "4,64", "--json", str(out)]
    if backend == "redis":
        args += ["--redis-url", str(request.getfixturevalue("redis_url"))]
    assert main(args) == 0
    figures = json.loads(out.read_text())["sizes"]
    assert [(f["backend"], f["members"]) for f in figures] == [(backend, 4), (backend, 64)]
    for f in figures:
        assert f["entries"] == f["messages"] * f["members"]
        for name in NUMBERS:
            assert isinstance(f[name], int | float) and f[name] >= 0, name
        assert f["p99_ms"] >= f["p50_ms"]
    printed = capsys.readouterr().out
    assert "entries/s" in printed and backend in printed


def test_bench_delivery_idle_streams_prints_latency_with_and_without_and_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The idle-streams phase alone (``--members ''``): a holder process opens the
    streams, and the figures come back whole."""
    out = tmp_path / "idle.json"
    args = ["--backend", "memory", "--members", "", "--idle-streams", "64", "--idle-rounds", "2"]
    assert main([*args, "--idle-commits", "50", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["sizes"] == []
    [idle] = saved["idle_streams"]
    assert idle["streams"] == 64 and idle["commits"] == 50 and idle["rounds"] == 2
    assert len(idle["p99_without_ms"]) == 3 and len(idle["p99_with_ms"]) == 2
    for run in ("without", "with"):
        for p50, p99 in zip(idle[f"p50_{run}_ms"], idle[f"p99_{run}_ms"], strict=True):
            assert 0 < p50 <= p99, run
    around = idle["p99_without_ms"]
    first = idle["p99_with_ms"][0] / ((around[0] + around[1]) / 2)
    assert abs(idle["p99_ratios"][0] - first) < 0.01  # each round against the runs around it
    assert min(idle["p99_ratios"]) <= idle["p99_ratio"] <= max(idle["p99_ratios"])
    assert idle["open_s"] >= 0 and isinstance(idle["rss_per_stream_kib"], int | float)
    assert "idle streams (memory): 64 open" in capsys.readouterr().out
