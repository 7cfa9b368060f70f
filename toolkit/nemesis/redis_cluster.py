"""The nemesis's Redis Cluster: 3 masters + 3 replicas, each node behind its own proxy.

Every node announces its proxy (``cluster-announce-ip 127.0.0.1``,
``cluster-announce-port`` = the proxy's port, ``cluster-announce-bus-port`` = the
node's real bus port): CLUSTER SLOTS, MOVED and ASK send the service through the
proxies, so a toxic on a master's proxy touches the service's traffic (``start``
refuses a cluster whose slot map names any other address). The cluster bus is not
proxied (gossip and failure detection go direct), but replication is: a replica
reaches its master at the address the master announces, so a toxic on a master's
proxy also holds its replica's stream and its WAIT acknowledgements (ACKs are then
refused or unknown, never given unreplicated).

Faults target a shard (``0..2``: the master that serves slot 0, 5461 or 10923 when the
fault begins), never a fixed node, since failovers move the masters around:

* ``kill-node`` / ``pause-node``: SIGKILL / SIGSTOP of the shard's master, one at a
  time (``most`` 1). After ``cluster-node-timeout`` (2 s) its replica takes the
  slots over; the killed node restarts at the fault's end and rejoins as a replica
  (a resumed one is demoted). A master and its replica are never both down: storage
  faults do not overlap, and the end of a kill waits (up to ``REJOIN_S``) for the
  restarted node's replication link. Were they both down, the shard's slots would be
  lost and its commits refused (CLUSTERDOWN), never ACKed twice.
* toxics on the shard master's proxy, on up to two shards at once (latency: all three).

A failover seen at a kill's or pause's end (another node serves the shard) is counted
as the backend event ``redis-cluster failover`` and written into the proof's evidence.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from toolkit.nemesis import proof
from toolkit.nemesis import toxiproxy as tp
from toolkit.nemesis.proof import Proof
from toolkit.nemesis.schedule import FaultKind
from toolkit.nemesis.topology import (
    TOXICS,
    RedisTopology,
    Topology,
    _pid,
    _redis_topologies,
    toxic,
)
from toolkit.ports import free_port

SHARD_SLOTS = (0, 5461, 10923)
"""One slot of each master ``redis-cli --cluster create`` makes (0-5460, 5461-10922,
10923-16383): a shard is whoever serves its slot."""
REJOIN_S = 20.0
"""How long a kill's end waits for the restarted node to be a linked replica."""
FAILOVER_EVENT = "redis-cluster failover"


class RedisClusterTopology(RedisTopology):
    """``--backend redis-cluster``: see the module's docstring."""

    node_count = 6

    def __init__(self, work: Path, toxi: tp.Toxiproxy) -> None:
        Topology.__init__(self, work, toxi)
        self.kind = "cluster"
        self.sentinel = None
        self.cluster: Any = _redis_topologies().RedisClusterTopology(work / "redis-cluster")
        self.nodes = list(self.cluster.nodes)
        self.prefix = f"mc-nemesis-{uuid.uuid4().hex[:8]}"
        self.proxy_ports: list[int] = []
        self._hit: dict[tuple[str, int], int] = {}  # (kind, shard) -> the node it hit
        self._paused: set[int] = set()
        self._events: Counter[str] = Counter()

    def fault_kinds(self) -> list[FaultKind]:
        return shard_fault_kinds()

    async def start(self) -> None:
        for i, node in enumerate(self.nodes):
            port = free_port()
            listen = f"127.0.0.1:{port}"
            self.toxi.create_proxy(f"rcluster{i}", listen, node.address)
            self.proxies.append(f"rcluster{i}")
            self.listen.append(listen)
            self.proxy_ports.append(port)
            node.extra += ["--cluster-announce-ip", "127.0.0.1",
                           "--cluster-announce-port", str(port),
                           "--cluster-announce-bus-port", str(node.port + 10_000)]  # fmt: skip
        await asyncio.to_thread(self.cluster.start)
        await asyncio.to_thread(self._check_announced)
        await self._initialise()

    def _check_announced(self) -> None:
        """Every address in the slot map is one of the proxies (or toxics miss the service)."""
        with self.nodes[0].client() as c:
            slots = c.execute_command("CLUSTER", "SLOTS")
        ports = {int(entry[1]) for row in slots for entry in row[2:]}
        if not ports or not ports <= set(self.proxy_ports):
            raise RuntimeError(f"the cluster announces ports {sorted(ports)}, not its proxies'")

    def serve_env(self) -> dict[str, str]:
        return {"MC_REDIS_URL": "redis+cluster://" + ",".join(self.listen)}

    def events(self) -> Counter[str]:
        return Counter(self._events)

    def shard_master(self, shard: int, exclude: int = -1) -> int:
        """The node that serves ``shard``'s slot, as the first running node answering sees it."""
        for i, node in enumerate(self.nodes):
            if not node.running or i in self._paused or i == exclude:
                continue
            try:
                with node.client() as c:
                    slots = c.execute_command("CLUSTER", "SLOTS")
            except Exception:
                continue
            for row in slots:
                if int(row[0]) <= SHARD_SLOTS[shard] <= int(row[1]):
                    return self.proxy_ports.index(int(row[2][1]))
        raise RuntimeError(f"no running node names the master of shard {shard}")

    async def begin(self, kind: str, target: int) -> None:
        node = await asyncio.to_thread(self.shard_master, target)
        self._hit[(kind, target)] = node
        if kind in TOXICS:
            added = self.toxi.add_toxic(self.proxies[node], toxic(TOXICS[kind]))
            self._toxics[(kind, target)] = added
        elif kind in ("kill-node", "pause-node"):
            self._pids[(kind, target)] = _pid(self.nodes[node])
            if kind == "kill-node":
                self.nodes[node].kill()
            else:
                self._paused.add(node)
                self.nodes[node].pause()
        else:
            raise ValueError(f"unknown storage fault {kind}")

    async def end(self, kind: str, target: int) -> None:
        node = self._hit[(kind, target)]
        if kind in TOXICS:
            name = self._toxics.pop((kind, target), None)
            if name is not None:
                self.toxi.remove_toxic(self.proxies[node], name)
        elif kind == "kill-node":
            await asyncio.to_thread(self.nodes[node].start)
        elif kind == "pause-node":
            self.nodes[node].resume()
            self._paused.discard(node)

    def prove_begin(self, kind: str, target: int) -> Proof:
        node = self._hit[(kind, target)]
        if kind in TOXICS:
            found = self._prove_toxic(TOXICS[kind], node)
            ours = {p for n in self.nodes if (p := _pid(n)) is not None}
            clients = clients_through(self.proxy_ports[node], ours)
            return Proof(found.ok, f"master of shard {target} = node {node}, {clients} client"
                         f" connection(s) through its proxy: {found.evidence}")  # fmt: skip
        found = super().prove_begin(kind, target)
        return Proof(found.ok, f"master of shard {target} = node {node}: {found.evidence}")

    def prove_end(self, kind: str, target: int) -> Proof | None:
        """A kill: the restarted node answers and is a replica again (``REJOIN_S``);
        a kill or pause: whether another node took the shard over (a failover)."""
        if kind not in ("kill-node", "pause-node"):
            return None
        node = self._hit[(kind, target)]
        ok, seen = True, []
        if kind == "kill-node":
            result = proof.probe(self.nodes[node].address, self.probe_request, 5.0)
            ok = bool(result.reply)
            seen.append(f"node {node} restarted as pid {_pid(self.nodes[node])}: probe"
                        f" {result.failure or 'answered'}")  # fmt: skip
        role, master = self._settle(node, target, REJOIN_S)
        if master not in (node, -1):
            self._events[FAILOVER_EVENT] += 1
            seen.append(f"failover: shard {target} now served by node {master}")
        seen.append(f"node {node} is a {role}")
        return Proof(ok, "; ".join(seen))

    def _settle(self, node: int, shard: int, wait_s: float) -> tuple[str, int]:
        """Wait until ``node`` and the rest of the cluster agree: it serves ``shard``
        as its master, or it is a replica with its link up and another node serves it
        (the failover). Its role and the shard's master then (as the others see it)."""
        deadline = time.monotonic() + wait_s
        while True:
            role, linked = "?", False
            try:
                with self.nodes[node].client() as c:
                    info = c.info("replication")
                role = "replica" if info.get("role") == "slave" else str(info.get("role"))
                linked = info.get("master_link_status") == "up"
                master = self.shard_master(shard, exclude=node)
            except Exception:
                master = -1
            agreed = (role == "master" and master == node) or (
                role == "replica" and linked and master not in (node, -1)
            )
            if agreed or time.monotonic() >= deadline:
                return role, master
            time.sleep(0.2)

    def node_pid(self, index: int, kind: str = "") -> int | None:
        return _pid(self.nodes[index])

    def node_address(self, index: int, kind: str = "") -> str:
        return str(self.nodes[index].address)

    async def heal(self) -> None:
        """Toxics off, every node running and resumed, the cluster ok and every
        replica linked (a replica that never synced would refuse to take over)."""
        self.toxi.reset()
        self._toxics.clear()
        for node in self.nodes:
            node.resume()
            if not node.running:
                await asyncio.to_thread(node.start)
        self._paused.clear()
        await asyncio.to_thread(self.cluster.wait_ok, 60.0)
        await asyncio.to_thread(self.cluster.wait_replicas_linked, 60.0)

    def close(self) -> None:
        self.cluster.close()


def shard_fault_kinds() -> list[FaultKind]:
    """Targets are shards; one master killed or paused at a time, toxics on up to two
    masters' proxies (latency: all three)."""
    shards = len(SHARD_SLOTS)
    kinds = [FaultKind("kill-node", shards), FaultKind("pause-node", shards)]
    for name in TOXICS:
        kinds.append(FaultKind(name, shards, shards if name.startswith("latency") else 2))
    return kinds


def clients_through(port: int, exclude: set[int]) -> int:
    """Established connections to 127.0.0.1:``port`` (a proxy) held by processes other
    than ``exclude`` (the cluster's own nodes, whose replication goes through it too):
    the service's connections that a toxic on that proxy holds."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "01" and int(cols[2].rpartition(":")[2], 16) == port:
                inodes.add(cols[9])
    for pid in exclude:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            inodes.discard(target.removeprefix("socket:[").removesuffix("]"))
    return len(inodes)
