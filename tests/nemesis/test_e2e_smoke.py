"""CI smoke of ``message-committer nemesis --system e2e``: one short schedule on a
standalone Redis behind Toxiproxy, three serve and two relay processes, three users
with two device processes each; a relay, a device and a serve replica are killed
and a relay restarted under faketime (each proven), and neither the commit checkers
nor the delivery and lane checks find an anomaly. Then one short schedule of a build
whose relay leaves some mailbox appends out (``--sabotage skipped-entry``): devices
lack messages History holds, ``lost``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.process import run_cli_bounded

pytestmark = pytest.mark.redis
KINDS = ("kill-relay", "kill-device", "kill-replica", "clock-relay")
# Seed 1 with these kinds, 20 s and faults of at most 3 s fires each kind.


def test_the_e2e_smoke_finds_no_anomaly(tmp_path: Path) -> None:
    result = run_cli_bounded(
        ["nemesis", "--system", "e2e", "--backend", "redis", "--schedules", "1",
         "--duration", "20", "--max-fault-seconds", "3", "--seed", "1", "--faults",
         ",".join(KINDS), "--clients", "3", "--keep-dir", str(tmp_path)],
        timeout=400,
    )  # fmt: skip
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "anomalies: 0 (checker), 0 (porcupine)"
    assert "e2e anomalies: 0 (delivery 0, lanes 0)" in result.stdout
    proven = re.search(r"faults proven over 1 schedule\(s\): (.*)", result.stdout)
    assert proven is not None
    assert {k.split(" x")[0] for k in proven[1].split(", ")} == set(KINDS)
    persisted = re.search(r"sends persisted (\d+)", result.stdout)
    assert persisted is not None and int(persisted[1]) > 0
    compared = re.search(r"compared with History (\d+)", result.stdout)
    assert compared is not None and int(compared[1]) > 0


def test_the_e2e_smoke_catches_a_skipped_mailbox_entry(tmp_path: Path) -> None:
    result = run_cli_bounded(
        ["nemesis", "--system", "e2e", "--backend", "redis", "--schedules", "1",
         "--duration", "10", "--max-fault-seconds", "2", "--seed", "5", "--faults",
         "kill-device", "--clients", "2", "--sabotage", "skipped-entry",
         "--keep-dir", str(tmp_path)],
        timeout=400,
    )  # fmt: skip
    print(result.stdout[-3000:])
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"e2e: lost: \S+ lacks ", result.stdout), result.stdout[-3000:]
