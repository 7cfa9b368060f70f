"""CI smoke of ``message-committer nemesis``: one schedule on Redis behind Toxiproxy,
three replicas, real gRPC clients, both checkers; every cheap fault kind (storage kill
and pause, every toxic but the 6 s latency, replica kill, pause and faketime clock)
fires and is proven (its effect observed), nothing fails the run, and neither checker
finds an anomaly. Then one short schedule of a sabotaged build (``--sabotage
wrong-refusal``), which both must catch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.process import run_cli_bounded
from tests.nemesis.smoke import clean_run

pytestmark = pytest.mark.redis
KINDS = ("kill-node", "pause-node", "latency", "timeout", "timeout-reply", "reset-peer",
         "reset-reply", "kill-replica", "pause-replica", "clock-offset")  # fmt: skip
# Seed 1 with these kinds, 42 s and faults of at most 2 s fires every kind in one schedule.


def test_the_nemesis_smoke_finds_no_anomaly(tmp_path: Path) -> None:
    stdout = clean_run(
        ["--backend", "redis", "--schedules", "1", "--duration", "42", "--max-fault-seconds",
         "2", "--seed", "1", "--clients", "6", "--keep-dir", str(tmp_path)],
        KINDS, "nemesis smoke",
    )  # fmt: skip
    acks = [int(n) for n in re.findall(r"acks (\d+)", stdout)]
    assert len(acks) == 1 and min(acks) > 0
    assert len(list(tmp_path.glob("schedule-*.jsonl"))) == 1


def test_the_nemesis_smoke_catches_a_sabotaged_build(tmp_path: Path) -> None:
    result = run_cli_bounded(
        ["nemesis", "--backend", "redis", "--schedules", "1", "--duration", "8",
         "--max-fault-seconds", "2", "--seed", "5", "--faults", "latency", "--clients", "4",
         "--sabotage", "wrong-refusal", "--keep-dir", str(tmp_path)],
        timeout=300,
    )  # fmt: skip
    print(result.stdout[-3000:])
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"anomalies: (\d+) \(checker\), (\d+) \(porcupine\)", last)
    assert found is not None and min(int(found[1]), int(found[2])) > 0, last
    assert "checker: wrong-refusal in " in result.stdout
