"""A throwaway N-node Apache Cassandra 5.0 cluster on loopback aliases, for tests and laptops.

Linux routes all of 127.0.0.0/8 to ``lo``, so node i listens on 127.0.0.<first + i>
(default first address 127.0.0.11: .11, .12, .13, ...) without any setup. All nodes
share one CQL port and one storage port, picked free on every node's address, as a
real cluster shares 9042 (clients then need one port, as the service's config has).
Every node gets an evenly spaced initial token (Murmur3, one token per node), the
first node is the only seed, and nodes are started one after another (Cassandra
refuses concurrent joins). ``storage_first_address`` gives node i a second address,
127.0.x.<first + i>, as its ``broadcast_address``: peers then reach its storage port
only there, where a fault proxy (the nemesis's Toxiproxy) listens on the same port and
forwards to the node, so cutting that proxy cuts the node off from its peers. The
snitch is GossipingPropertyFileSnitch with one data
centre ("dc1") or two ("dc1" gets the larger half: 3 nodes -> 2 + 1, 4 nodes ->
2 + 2). Heap and thread pools are sized so that three or four nodes
share a 2-core, 24 GiB machine (see ``CLUSTER_SIZING``).

    python deploy/cassandra/cassandra_cluster.py start --nodes 3 [--dcs 2] --data-dir D

prints one line per node (``name dc host:port pid``) and the contact points, then runs
until SIGINT/SIGTERM. The Python API (``CassandraCluster``) starts, stops, kills
(SIGKILL), pauses (SIGSTOP) and resumes (SIGCONT) single nodes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import socket
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
FIRST_ADDRESS = "127.0.0.11"
"""127.0.0.1 is left alone: the shared development node (and others) live there."""
MODULE_NAME = "mc_cassandra_node"  # the name tests/servers/cql_server.py loads it under
MIN_TOKEN = -(2**63)


def _node_module() -> ModuleType:
    """cassandra_node.py (the single-node launcher), loaded once by path."""
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    spec = importlib.util.spec_from_file_location(MODULE_NAME, HERE / "cassandra_node.py")
    if spec is None or spec.loader is None:
        raise ImportError("cannot load cassandra_node.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


node_module = _node_module()
CassandraNode = node_module.CassandraNode
CassandraError = node_module.CassandraError
Placement = node_module.Placement
Sizing = node_module.Sizing

CLUSTER_SIZING = Sizing(
    heap="640M",
    concurrent_reads=4,
    concurrent_writes=4,
    compaction_mib_per_s=8,
    native_transport_max_threads=16,
    # Fewer JVM threads: three JVMs share two cores.
    jvm_extra=("-XX:ParallelGCThreads=2", "-XX:ConcGCThreads=1", "-XX:CICompilerCount=2"),
)
UP_LINE = "is now UP"
"""Gossip logs ``InetAddress /<host>:<port> is now UP`` for each live peer."""
DOWN_LINE = "is now DOWN"


def tokens(count: int) -> list[str]:
    """``count`` evenly spaced Murmur3 tokens."""
    step = 2**64 // count
    return [str(MIN_TOKEN + i * step) for i in range(count)]


def layout(nodes: int, dcs: int) -> list[str]:
    """The data centre of each node: one DC, or two with dc1 holding the larger half."""
    if dcs not in (1, 2):
        raise ValueError("dcs must be 1 or 2")
    if dcs == 2 and nodes < 2:
        raise ValueError("two data centres need at least two nodes")
    first = (nodes + 1) // 2 if dcs == 2 else nodes
    return ["dc1"] * first + ["dc2"] * (nodes - first)


def address(index: int, first: str = FIRST_ADDRESS) -> str:
    a, b, c, d = (int(part) for part in first.split("."))
    if a != 127 or d + index > 254:
        raise ValueError("cluster addresses must stay inside 127.0.0.0/8")
    return f"{a}.{b}.{c}.{d + index}"


class CassandraCluster:
    """N nodes, one seed, on 127.0.0.<first>..; node data in <data dir>/node<i>."""

    def __init__(
        self,
        data_dir: str | Path,
        nodes: int = 3,
        *,
        dcs: int = 1,
        first_address: str = FIRST_ADDRESS,
        commitlog_sync: Literal["periodic", "batch"] = "periodic",
        sizing: Any = None,
        storage_first_address: str = "",
    ) -> None:
        """``storage_first_address``: where the nodes' broadcast addresses begin (empty:
        none; peers reach each node at its listen address)."""
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.data_dir = Path(data_dir).resolve()
        self.dcs = dcs
        dc_of = layout(nodes, dcs)
        hosts = [address(i, first_address) for i in range(nodes)]
        self.peer_hosts = (
            [address(i, storage_first_address) for i in range(nodes)]
            if storage_first_address
            else hosts
        )
        """The address each node's peers reach it at (its broadcast address)."""
        native, storage = _saved_ports(self.data_dir) or _common_ports(
            hosts + [h for h in self.peer_hosts if h not in hosts]
        )
        seeds = f"{self.peer_hosts[0]}:{storage}"
        self.nodes: list[Any] = []
        for i, (host, token) in enumerate(zip(hosts, tokens(nodes), strict=True)):
            broadcast = self.peer_hosts[i] if storage_first_address else ""
            self.nodes.append(
                CassandraNode(
                    self.data_dir / f"node{i + 1}",
                    native,
                    host=host,
                    storage_port=storage,
                    commitlog_sync=commitlog_sync,
                    placement=Placement(
                        seeds=seeds, initial_token=token, dc=dc_of[i], broadcast=broadcast
                    ),
                    sizing=sizing or CLUSTER_SIZING,
                )
            )
        self.start_seconds: list[float] = []
        """Seconds each node took to start, in start order (the last ``start``)."""

    # --- whole cluster -------------------------------------------------------

    @property
    def port(self) -> int:
        """The CQL port every node listens on."""
        return int(self.nodes[0].port)

    @property
    def storage_port(self) -> int:
        """The storage (inter-node) port every node listens on."""
        return int(self.nodes[0].storage_port)

    @property
    def contact_points(self) -> list[str]:
        return [n.host for n in self.nodes]

    def dc_of(self, index: int) -> str:
        return str(self.nodes[index].placement.dc)

    def replication(self, per_dc: int | None = None) -> str:
        """The keyspace replication for ``backends.scylla.migrate``: every node holds a
        replica (NetworkTopologyStrategy, per data centre)."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.placement.dc] = counts.get(node.placement.dc, 0) + 1
        parts = ",".join(f"{dc}={per_dc or n}" for dc, n in counts.items())
        return f"NetworkTopologyStrategy:{parts}"

    def start(self, timeout: float = 240) -> None:
        """Start every stopped node, the others side by side once the seed's gossip
        port is open, wait until each takes CQL clients, then until each sees the rest.
        No node bootstraps (``auto_bootstrap: false``, a fixed token each), so none
        streams data; a non-seed only needs the seed to answer its gossip shadow round
        (without it: "Unable to gossip with any peers"). ``start_seconds``: each
        node's seconds from the first launch to ready."""
        node_module.ensure_jars()
        self.start_seconds = []
        try:
            began = time.monotonic()
            launched = [n for n in self.nodes if not n.is_running()]
            seed = self.nodes[0]
            if seed in launched:
                seed.launch()
                seed.wait_gossip_port(timeout)
            for node in launched:
                if node is not seed:
                    node.launch()
            for node in launched:
                node.wait_ready(max(1.0, timeout - (time.monotonic() - began)))
                self.start_seconds.append(time.monotonic() - began)
            self.wait_all_up(timeout)
        except BaseException:
            self.kill()
            raise

    def wait_all_up(self, timeout: float = 120) -> None:
        """Until every running node's log (since its start) reports each other running
        node UP; CassandraError when that does not happen in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._sees_all(n) for n in self.nodes if n.is_running()):
                return
            time.sleep(0.25)
        raise CassandraError(f"the nodes did not see each other within {timeout:.0f}s")

    def _sees_all(self, node: Any) -> bool:
        """Whether ``node``'s log (since its start) last reported each other running
        node UP: a peer marked DOWN after a partition or a kill counts again only
        once it is UP again."""
        try:
            text = node.log_path.read_text(errors="replace")[node_start_offset(node) :]
        except OSError:
            return False
        me = self.nodes.index(node)
        others = [i for i, n in enumerate(self.nodes) if i != me and n.is_running()]
        return all(last_state(text, self.peer_hosts[i]) == "UP" for i in others)

    def stop(self, grace: float = 30) -> None:
        for node in reversed(self.nodes):
            node.stop(grace)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def rss_bytes(self) -> list[int]:
        return [int(n.rss_bytes()) for n in self.nodes]

    # --- one node (index from 0) --------------------------------------------

    def start_node(self, index: int, timeout: float = 240) -> float:
        """Start one node and wait until it and the others see each other; seconds taken."""
        node = self.nodes[index]
        began = time.monotonic()
        if not node.is_running():
            node.start(timeout)
        self.wait_all_up(timeout)
        return time.monotonic() - began

    def stop_node(self, index: int, grace: float = 30) -> None:
        self.nodes[index].stop(grace)

    def kill_node(self, index: int) -> None:
        self.nodes[index].kill()

    def pause_node(self, index: int) -> None:
        self.nodes[index].pause()

    def resume_node(self, index: int) -> None:
        self.nodes[index].resume()

    def __enter__(self) -> CassandraCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _saved_ports(data_dir: Path) -> tuple[int, int] | None:
    """The ports of an existing cluster in ``data_dir`` (node1's ports.json)."""
    saved = data_dir / "node1" / "ports.json"
    if not saved.exists():
        return None
    ports = json.loads(saved.read_text())
    return int(ports["native"]), int(ports["storage"])


def _common_ports(hosts: list[str], attempts: int = 50) -> tuple[int, int]:
    """Two ports free on every one of ``hosts``."""
    found: list[int] = []
    for _ in range(attempts):
        port = node_module.free_port(*found, host=hosts[0])
        if all(_free_on(h, port) for h in hosts[1:]):
            found.append(port)
        if len(found) == 2:
            return found[0], found[1]
    raise CassandraError("no port is free on every cluster address")


def _free_on(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def last_state(log: str, host: str) -> str:
    """``UP``, ``DOWN`` or empty: what gossip in ``log`` last said of the peer at ``host``
    (``InetAddress /<host>:<port> is now UP``)."""
    state = ""
    for line in log.splitlines():
        if f"/{host}:" in line:
            if UP_LINE in line:
                state = "UP"
            elif DOWN_LINE in line:
                state = "DOWN"
    return state


def node_start_offset(node: Any) -> int:
    """Where in the node's log its current run began (set by ``CassandraNode.start``)."""
    return int(getattr(node, "log_offset", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start", help="run a cluster in the foreground until SIGINT/SIGTERM")
    start.add_argument("--nodes", type=int, default=3)
    start.add_argument("--dcs", type=int, choices=[1, 2], default=1)
    start.add_argument("--data-dir", type=Path, required=True)
    start.add_argument("--first-address", default=FIRST_ADDRESS)
    start.add_argument("--commitlog-sync", choices=["periodic", "batch"], default="periodic")
    start.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args(argv)

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cluster = CassandraCluster(
        args.data_dir,
        args.nodes,
        dcs=args.dcs,
        first_address=args.first_address,
        commitlog_sync=args.commitlog_sync,
    )
    try:
        began = time.monotonic()
        cluster.start(args.timeout)
        total = time.monotonic() - began
        for i, node in enumerate(cluster.nodes):
            rss = node.rss_bytes() / 2**20
            print(
                f"node{i + 1} {cluster.dc_of(i)} {node.host}:{node.port} pid {node.pid}"
                f" started in {cluster.start_seconds[i]:.1f}s rss {rss:.0f} MiB",
                flush=True,
            )
        print(f"cluster up in {total:.1f}s; replication {cluster.replication()}", flush=True)
        print(f"contact points {','.join(cluster.contact_points)} port {cluster.port}", flush=True)
        while not stopping and all(n.is_running() for n in cluster.nodes):
            time.sleep(0.5)
        if not stopping:
            print("a node exited unexpectedly; see its logs/system.log", file=sys.stderr)
            return 1
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
