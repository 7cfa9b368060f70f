"""CI smoke of ``message-committer nemesis --backend redis-cluster``: one short schedule
on a Redis Cluster of 3 masters + 3 replicas, each node behind its own Toxiproxy proxy
(the nodes announce the proxies), three replicas, real gRPC clients, both checkers. A
shard's master is killed for 5 s (about its failover time) and a ``timeout`` toxic holds
the proxies of two shards' masters; both fire and are proven, nothing fails the run,
and neither checker finds an anomaly."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.process import run_cli_bounded

pytestmark = pytest.mark.redis
KINDS = ("kill-node", "timeout")
# Seed 6 with these kinds, 12 s and faults of at most 6 s: kill-node[0] at 2 s for 5 s,
# then timeout[0,1] for 2.7 s.


def test_the_redis_cluster_nemesis_smoke_finds_no_anomaly(tmp_path: Path) -> None:
    began = time.monotonic()
    result = run_cli_bounded(
        ["nemesis", "--backend", "redis-cluster", "--schedules", "1", "--duration", "12",
         "--max-fault-seconds", "6", "--seed", "6", "--faults", ",".join(KINDS),
         "--clients", "4", "--keep-dir", str(tmp_path)],
        timeout=300,
    )  # fmt: skip
    print(result.stdout[-3000:])
    print(f"redis-cluster nemesis smoke took {time.monotonic() - began:.1f}s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "anomalies: 0 (checker), 0 (porcupine)"
    assert "FAILED" not in result.stdout
    proven = next(line for line in lines if line.startswith("faults proven over"))
    for kind in KINDS:
        assert re.search(rf"\b{kind} x1\b", proven), proven
    history = (tmp_path / "schedule-6.jsonl").read_text()
    assert re.search(r'"evidence":"master of shard \d = node \d, [1-9]\d* client conn', history)
