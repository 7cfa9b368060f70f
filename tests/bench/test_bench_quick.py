"""Smoke test of ``message-committer bench --quick``: it completes and writes well-formed JSON.

Figures are not asserted (the machine is shared and noisy); only that every
expected key is there and every number is a non-negative number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from toolkit.bench.cli import main

PHASES = (
    "fresh-serial",
    "grpc-floor",
    "fresh",
    "replay",
    "dupmix",
    "conflict",
    "hot",
    "history",
    "storage-floor",
    "storage-replay",
    "committer-floor",
    "sustained",
)
PHASE_NUMBERS = (
    "calls",
    "ok",
    "duration_s",
    "ops_per_s",
    "server_cpu_us_per_op",
    "client_cpu_us_per_op",
)
LATENCIES = ("p50", "p90", "p99", "p999", "max", "mean")
RATIOS = (
    "service_over_grpc_floor",
    "service_over_storage_floor",
    "service_over_committer_floor",
    "replay_over_fresh",
    "storage_replay_over_fresh",
    "hot_over_spread",
    "p99_over_p50",
)


def _non_negative(value: Any, where: str) -> None:
    assert isinstance(value, int | float) and not isinstance(value, bool), where
    assert math.isfinite(value) and value >= 0, where


def _check_document(document: dict[str, Any], backend: str) -> None:
    assert document["schema"] == "message-committer-bench/1"
    for key in ("nproc", "cpu_model", "memory_gib"):
        assert key in document["machine"]
    assert document["settings"]["quick"] is True
    result = document["backends"][backend]
    assert result["backend"] == backend
    for name in PHASES:
        phase = result["phases"][name]
        for key in PHASE_NUMBERS:
            _non_negative(phase[key], f"{name}.{key}")
        for key in LATENCIES:
            _non_negative(phase["latency_ms"][key], f"{name}.latency_ms.{key}")
        assert phase["ok"] > 0, f"{name}: nothing succeeded"
        for counts in (phase["errors"], phase["expected"]):
            for code, count in counts.items():
                assert isinstance(code, str)
                _non_negative(count, f"{name}.{code}")
        assert phase["cost_per_op"] is not None, name
        for kind, cost in phase["cost_per_op"].items():
            _non_negative(cost, f"{name}.cost_per_op.{kind}")
    for key in RATIOS:
        value = result["ratios"][key]
        assert value is not None, key
        _non_negative(value, key)
    for key in ("service_over_grpc_floor", "replay_over_fresh", "hot_over_spread"):
        value = result["cpu_ratios"][key]
        assert value is not None, key
        _non_negative(value, f"cpu_ratios.{key}")
    slope = result["slope"]
    assert 0 < slope["commits"] <= document["settings"]["sustained"]
    for key in ("first_per_s", "last_per_s", "ratio"):
        value = slope[key]
        _non_negative(value, f"slope.{key}")
        assert value > 0, f"slope.{key}"
    relay = "inside serve" if backend == "memory" else "a relay process beside the server"
    assert slope["relay"] == relay
    for target in document["targets"]:
        assert {"name", "backend", "value", "bound", "comparison", "passed", "cpu_estimate"} <= set(
            target
        )
        assert target["passed"] in (True, False, None)


def _run(tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    code = main(["--quick", "--json", str(out), *argv])
    assert code == 0
    document: dict[str, Any] = json.loads(out.read_text())
    return document


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.slow
def test_quick_bench_on_memory(tmp_path: Path) -> None:
    document = _run(tmp_path, "--backend", "memory", "--plot", str(tmp_path / "bench.png"))
    _check_document(document, "memory")
    names = {t["name"] for t in document["targets"]}
    assert any("gRPC floor" in n for n in names)
    assert document["settings"]["event_loop"] == "uvloop"  # auto, with the extra installed
    width, height = _png_size(tmp_path / "bench.png")
    assert width > 1000 and height > 400
    again = tmp_path / "again.png"
    assert main(["--plot", str(again), "--from-json", str(tmp_path / "bench.json")]) == 0
    assert _png_size(again) == (width, height)


@pytest.mark.slow
def test_compare_loops_runs_both_loops_in_one_run(tmp_path: Path) -> None:
    document = _run(
        tmp_path,
        "--backend",
        "memory",
        "--compare-loops",
        "--rounds",
        "1",
        "--workloads",
        "fresh",
        "--no-floors",
        "--serial-commits",
        "0",
        "--plot",
        str(tmp_path / "loops.png"),
    )
    loops = document["event_loops"]["memory"]
    for loop in ("asyncio", "uvloop"):
        for phase in ("grpc-floor", "fresh"):
            assert len(loops[loop][phase]["round_ops_per_s"]) == 1
            assert loops[loop][phase]["ok"] > 0
    for phase in ("grpc-floor", "fresh"):
        _non_negative(loops["uvloop_over_asyncio"][phase], phase)
    assert document["backends"]["memory"]["phases"]["fresh"] == loops["uvloop"]["fresh"]
    assert _png_size(tmp_path / "loops.png")[0] > 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["--backend", "memory", "--plot", "figures.svg"],
        ["--from-json", "bench.json"],
        ["--quick"],
    ],
)
def test_bad_plot_arguments_exit_2(argv: list[str]) -> None:
    assert main(argv) == 2


@pytest.mark.slow
@pytest.mark.redis
def test_quick_bench_on_redis(tmp_path: Path, redis_url: str) -> None:
    document = _run(tmp_path, "--backend", "redis", "--redis-url", redis_url)
    _check_document(document, "redis")
    record = document["backends"]["redis"]["redis_record"]
    _non_negative(record["memory_usage_bytes"], "redis_record.memory_usage_bytes")
    assert isinstance(record["encoding"], str)
    assert document["settings"]["backend_address_given"] is True
