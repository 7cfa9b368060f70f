"""The CQL cluster launcher's storage proxies: with ``storage_first_address`` each node
broadcasts a second address (where the nemesis's proxy listens on the storage port),
the seed list names it, and gossip's last word on a peer decides whether it is up."""

from __future__ import annotations

from pathlib import Path

from toolkit.nemesis.topology import CLUSTER_LAUNCHER, PARTITION, ScyllaTopology, _load

launcher = _load("mc_cassandra_cluster", CLUSTER_LAUNCHER)


def _config(cluster: object, index: int) -> str:
    node = cluster.nodes[index]  # type: ignore[attr-defined]
    return str(node._write_config().read_text())


def test_each_node_broadcasts_its_proxy_address_and_the_seed_is_named_by_it(
    tmp_path: Path,
) -> None:
    cluster = launcher.CassandraCluster(tmp_path, 3, storage_first_address="127.0.2.11")
    assert cluster.peer_hosts == ["127.0.2.11", "127.0.2.12", "127.0.2.13"]
    config = _config(cluster, 1)
    assert "listen_address: 127.0.0.12\n" in config
    assert "broadcast_address: 127.0.2.12\n" in config
    assert f'seeds: "127.0.2.11:{cluster.storage_port}"' in config


def test_without_proxies_peers_reach_the_listen_address(tmp_path: Path) -> None:
    cluster = launcher.CassandraCluster(tmp_path, 3)
    assert cluster.peer_hosts == cluster.contact_points
    config = _config(cluster, 2)
    assert "broadcast_address" not in config
    assert f'seeds: "127.0.0.11:{cluster.storage_port}"' in config


def test_a_peer_counts_as_up_only_when_gossip_last_said_so() -> None:
    up = "INFO  [GossipStage:1] Gossiper - InetAddress /127.0.2.12:7000 is now UP"
    down = "INFO  [GossipStage:1] FailureDetector - InetAddress /127.0.2.12:7000 is now DOWN"
    other = "INFO  [GossipStage:1] Gossiper - InetAddress /127.0.2.13:7000 is now UP"
    assert launcher.last_state("\n".join([up, down, other]), "127.0.2.12") == "DOWN"
    assert launcher.last_state("\n".join([up, down, up]), "127.0.2.12") == "UP"
    assert launcher.last_state(other, "127.0.2.12") == ""


def test_the_cql_topology_partitions_up_to_two_of_three_nodes(tmp_path: Path) -> None:
    topology = ScyllaTopology(tmp_path, toxi=None)  # type: ignore[arg-type]
    kinds = {k.name: k for k in topology.fault_kinds()}
    assert (kinds[PARTITION].pool, kinds[PARTITION].most) == (3, 2)
    assert topology.cluster.peer_hosts[0] != topology.cluster.contact_points[0]
