"""``nemesis --backend redis-cluster`` is ``--backend redis --redis-topology cluster``;
contradictory options are refused before anything starts, and the Cluster's faults aim
at shards: one master killed or paused at a time, never a master with its replica."""

from __future__ import annotations

import pytest

from toolkit.nemesis.cli import _backend, _parser, main
from toolkit.nemesis.redis_cluster import SHARD_SLOTS, shard_fault_kinds


@pytest.mark.parametrize(
    ("argv", "backend", "topology"),
    [
        (["--backend", "redis-cluster"], "redis", "cluster"),
        (["--backend", "redis-cluster", "--redis-topology", "cluster"], "redis", "cluster"),
        (["--backend", "redis", "--redis-topology", "cluster"], "redis", "cluster"),
        (["--backend", "redis"], "redis", "standalone"),
        (["--backend", "redis", "--redis-topology", "sentinel"], "redis", "sentinel"),
    ],
)
def test_the_backend_and_topology_options_resolve(
    argv: list[str], backend: str, topology: str
) -> None:
    args = _parser().parse_args(argv)
    assert _backend(args) is None
    assert (args.backend, args.redis_topology) == (backend, topology)


def test_a_contradictory_topology_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "redis-cluster", "--redis-topology", "sentinel"]) == 2
    assert "contradicts --redis-topology sentinel" in capsys.readouterr().err


def test_cluster_faults_aim_at_shards_one_master_down_at_a_time() -> None:
    kinds = {k.name: k for k in shard_fault_kinds()}
    assert kinds["kill-node"].pool == kinds["pause-node"].pool == len(SHARD_SLOTS)
    assert kinds["kill-node"].most == kinds["pause-node"].most == 1
    assert kinds["latency"].most == len(SHARD_SLOTS) and kinds["timeout"].most == 2
