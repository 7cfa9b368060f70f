"""CI smoke of ``message-committer nemesis --backend redis-cluster``: one short schedule
on a Redis Cluster of 3 masters + 3 replicas, each node behind its own Toxiproxy proxy
(the nodes announce the proxies), three replicas, real gRPC clients, both checkers. A
shard's master is killed for 5 s (about its failover time) and a ``timeout`` toxic holds
the proxies of two shards' masters; both fire and are proven, nothing fails the run,
and neither checker finds an anomaly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.nemesis.smoke import clean_run

pytestmark = pytest.mark.redis
KINDS = ("kill-node", "timeout")
# Seed 6 with these kinds, 12 s and faults of at most 6 s: kill-node[0] at 2 s for 5 s,
# then timeout[0,1] for 2.7 s.


def test_the_redis_cluster_nemesis_smoke_finds_no_anomaly(tmp_path: Path) -> None:
    clean_run(
        ["--backend", "redis-cluster", "--schedules", "1", "--duration", "12",
         "--max-fault-seconds", "6", "--seed", "6", "--clients", "4", "--keep-dir", str(tmp_path)],
        KINDS, "redis-cluster nemesis smoke",
    )  # fmt: skip
    history = (tmp_path / "schedule-6.jsonl").read_text()
    assert re.search(r'"evidence":"master of shard \d = node \d, [1-9]\d* client conn', history)
