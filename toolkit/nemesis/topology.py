"""The storage under the nemesis, with a Toxiproxy proxy in front of each storage node.

* ``ScyllaTopology``: the three-node Cassandra cluster of ``deploy/cassandra`` (RF 3,
  commitlog ``batch`` so that a kill -9 loses no acknowledged Paxos state), one proxy
  per node; replicas reach every node through its proxy (``--scylla-node-proxies``)
  at QUORUM / SERIAL. Each node also has a second proxy on its storage (inter-node)
  port: the node's ``broadcast_address`` is that proxy's, so every message its peers
  send it goes through there, and ``partition-node`` disables it (the node is cut off
  from its peers: nothing they send reaches it, so no request it coordinates gets an
  answer from them, and none they coordinate gets one from it).
* ``RedisTopology``: a standalone redis-server behind one proxy, or ``sentinel``:
  master + replica + 3 Sentinels (``tests/servers/redis_topologies.py``), whose URL
  form (``redis+sentinel://``) the Redis backend must support; ``cluster``: 3 masters +
  3 replicas, each behind its own proxy (``redis_cluster.py``).

Fault kinds of the storage: ``kill-node`` (SIGKILL, restarted at the fault's end),
``pause-node`` (SIGSTOP / SIGCONT), both on up to all nodes but one at once (two of
three CQL nodes down: commits are refused, never ACKed twice), and toxics on one or
more node proxies: ``latency`` (250 +- 150 ms), ``latency-long`` (6 s, above every
request timeout), ``timeout`` (requests swallowed on the way to the node),
``timeout-reply`` (the request runs, its reply is swallowed: a lost reply),
``reset-peer`` (reset before the node) and ``reset-reply`` (reset after the request was
sent on). Each fault's effect is observed right after it begins (``prove_begin``) and
a kill's restart at its end (``prove_end``); ``proof.py`` judges what was seen. The
launchers live in the development checkout (``deploy/``, ``tests/servers/``), as the
benchmark's do.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import uuid
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from toolkit.nemesis import proof
from toolkit.nemesis import toxiproxy as tp
from toolkit.nemesis.proof import Counters, Proof, ToxicSpec
from toolkit.nemesis.schedule import FaultKind
from toolkit.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CLUSTER_LAUNCHER = REPO / "deploy" / "cassandra" / "cassandra_cluster.py"
LONG_LATENCY_MS = 6000
"""Above the Scylla driver's 5 s request timeout, Redis's 2 s socket timeout and the
workload's 4 s attempt timeout: every call through it times out."""
TOXICS: dict[str, ToxicSpec] = {
    "latency": ToxicSpec("latency", "downstream", 250, 150),
    "latency-long": ToxicSpec("latency", "downstream", LONG_LATENCY_MS),
    "timeout": ToxicSpec("timeout", "upstream"),
    "timeout-reply": ToxicSpec("timeout", "downstream"),
    "reset-peer": ToxicSpec("reset_peer", "upstream"),
    "reset-reply": ToxicSpec("reset_peer", "downstream"),
}


def toxic(spec: ToxicSpec) -> tp.Toxic:
    stream: tp.Stream = "upstream" if spec.stream == "upstream" else "downstream"
    if spec.kind == "latency":
        return tp.latency(spec.latency_ms, spec.jitter_ms, stream)
    if spec.kind == "timeout":
        return tp.timeout(0, stream)
    return tp.reset_peer(0, stream)


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _redis_topologies() -> ModuleType:
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    return importlib.import_module("tests.servers.redis_topologies")


class Topology:
    """What the nemesis needs of a storage topology."""

    backend = ""
    node_count = 1
    restart_s = 15.0
    """How long a killed node may take to answer again, for the schedule's overrun."""
    service_start_s = 15.0
    """How long a restarted serve or relay process may take to open this storage."""
    probe_request = b""
    """A request every node answers at once, sent through a proxy to prove a toxic."""

    def __init__(self, work: Path, toxi: tp.Toxiproxy) -> None:
        self.work = work
        self.toxi = toxi
        self.proxies: list[str] = []  # one proxy name per node
        self.listen: list[str] = []  # the address each proxy listens on
        self._toxics: dict[tuple[str, int], str] = {}
        self._pids: dict[tuple[str, int], int | None] = {}

    def fault_kinds(self) -> list[FaultKind]:
        n = self.node_count
        most = max(1, n - 1)  # a majority of three may be down: two nodes at once
        kinds = [FaultKind("kill-node", n, most), FaultKind("pause-node", n, most)]
        for name in TOXICS:
            kinds.append(FaultKind(name, n, most=n if name.startswith("latency") else most))
        return kinds

    async def start(self) -> None:
        raise NotImplementedError

    def serve_args(self) -> list[str]:
        raise NotImplementedError

    def serve_env(self) -> dict[str, str]:
        return {}

    def events(self) -> Counter[str]:
        """Events the topology itself saw (a Redis Cluster's failovers), to add to the
        replicas' backend events."""
        return Counter()

    async def begin(self, kind: str, target: int) -> None:
        if kind in TOXICS:
            added = self.toxi.add_toxic(self.proxies[target], toxic(TOXICS[kind]))
            self._toxics[(kind, target)] = added
        elif kind == "kill-node":
            self._pids[(kind, target)] = self.node_pid(target)
            self.node(target).kill()
        elif kind == "pause-node":
            self._pids[(kind, target)] = self.node_pid(target)
            self.node(target).pause()
        else:
            raise ValueError(f"unknown storage fault {kind}")

    def prove_begin(self, kind: str, target: int) -> Proof:
        """Observe the effect of ``kind`` on ``target`` just after it began (blocking)."""
        if kind in TOXICS:
            return self._prove_toxic(TOXICS[kind], target)
        pid = self._pids.get((kind, target))
        if kind.startswith("kill-"):
            state = proof.wait_state(pid, ("", "Z", "X")) if pid else "?"
            return proof.judge_kill(pid, state)
        if kind.startswith("pause-"):
            state = proof.wait_state(pid, ("T", "t")) if pid else "?"
            return proof.judge_pause(pid, state)
        return Proof(False, f"no proof for {kind}")

    def prove_end(self, kind: str, target: int) -> Proof | None:
        """After a kill's end: the restarted node answers its probe (not through its
        proxy, which another fault may hold). None: nothing to prove at the end."""
        if not kind.startswith("kill-"):
            return None
        address = self.node_address(target, kind)
        result = proof.probe(address, self.probe_request, 5.0)
        pid = self.node_pid(target, kind)
        answer = result.failure or "answered"
        return Proof(bool(result.reply), f"restarted as pid {pid}: probe {answer}"
                     f" in {result.elapsed_s * 1000:.0f} ms")  # fmt: skip

    def _prove_toxic(self, spec: ToxicSpec, target: int) -> Proof:
        proxy = self.proxies[target]
        before = self._counters(proxy)
        wait = (spec.latency_ms + spec.jitter_ms) / 1000 + 3.0 if spec.kind == "latency" else 0
        result = proof.probe(self.listen[target], self.probe_request, wait or proof.QUIET_S)
        sent = len(self.probe_request)
        return proof.settled_toxic_proof(spec, result, before, lambda: self._counters(proxy), sent)

    def _counters(self, proxy: str) -> Counters:
        c = self.toxi.byte_counters(proxy)
        return Counters(c.get("upstream received", 0), c.get("upstream sent", 0),
                        c.get("downstream received", 0), c.get("downstream sent", 0))  # fmt: skip

    def node_pid(self, index: int, kind: str = "") -> int | None:
        raise NotImplementedError

    def node_address(self, index: int, kind: str = "") -> str:
        raise NotImplementedError

    async def end(self, kind: str, target: int) -> None:
        if kind in TOXICS:
            name = self._toxics.pop((kind, target), None)
            if name is not None:
                self.toxi.remove_toxic(self.proxies[target], name)
        elif kind == "kill-node":
            await self.restart_node(target)
        elif kind == "pause-node":
            self.node(target).resume()

    def node(self, index: int) -> Any:
        raise NotImplementedError

    async def restart_node(self, index: int) -> None:
        await asyncio.to_thread(self.node(index).start)

    async def heal(self) -> None:
        """Every toxic removed, every proxy enabled, every node running and resumed."""
        self.toxi.reset()
        self._toxics.clear()
        for i in range(self.node_count):
            self.node(i).resume()
            await self.restart_node(i)

    def close(self) -> None:
        raise NotImplementedError


STORAGE_PROXY_FIRST = "127.0.2.11"
"""The CQL nodes' broadcast addresses (their storage proxies) begin here."""
PARTITION = "partition-node"


class ScyllaTopology(Topology):
    backend = "scylla"
    node_count = 3
    restart_s = 150.0  # a CQL node on two shared cores: 60 to 240 s (docs/topologies.md)
    service_start_s = 120.0  # opening the cluster: 40 to 113 s at load 30 (seed 3500)
    probe_request = proof.CQL_OPTIONS

    def __init__(self, work: Path, toxi: tp.Toxiproxy, nodes: int = 3) -> None:
        super().__init__(work, toxi)
        self.node_count = nodes
        launcher = _load("mc_cassandra_cluster", CLUSTER_LAUNCHER)
        self.cluster: Any = launcher.CassandraCluster(
            work / "cassandra",
            nodes,
            commitlog_sync="batch",
            storage_first_address=STORAGE_PROXY_FIRST,
        )
        self.peer_proxies: list[str] = []
        """One proxy per node on its broadcast address: its peers' way in."""
        self.keyspace = f"mc_nemesis_{uuid.uuid4().hex[:8]}"
        self.routes: dict[str, int] = {}

    async def start(self) -> None:
        from backends.scylla.migrate import migrate

        storage = self.cluster.storage_port
        for i, (host, peer) in enumerate(
            zip(self.cluster.contact_points, self.cluster.peer_hosts, strict=True)
        ):
            name = f"peer{i}"
            self.toxi.create_proxy(name, f"{peer}:{storage}", f"{host}:{storage}")
            self.peer_proxies.append(name)
        # Started means every node's gossip saw every other UP at its broadcast
        # address, which only the proxy serves: the peers' traffic goes through it.
        # (Toxiproxy's byte counters would not show it: they count a connection
        # when it ends, and these last.)
        await asyncio.to_thread(self.cluster.start)
        for i, host in enumerate(self.cluster.contact_points):
            name = f"cql{i}"
            port = free_port()
            self.toxi.create_proxy(name, f"127.0.0.1:{port}", f"{host}:{self.cluster.port}")
            self.proxies.append(name)
            self.listen.append(f"127.0.0.1:{port}")
            self.routes[host] = port
        await migrate(
            self.cluster.contact_points,
            port=self.cluster.port,
            keyspace=self.keyspace,
            replication=self.cluster.replication(),
            request_timeout_s=30.0,
        )

    def fault_kinds(self) -> list[FaultKind]:
        return [*super().fault_kinds(), FaultKind(PARTITION, self.node_count, self.node_count - 1)]

    async def begin(self, kind: str, target: int) -> None:
        if kind == PARTITION:
            self.toxi.set_enabled(self.peer_proxies[target], False)
        else:
            await super().begin(kind, target)

    async def end(self, kind: str, target: int) -> None:
        if kind == PARTITION:
            self.toxi.set_enabled(self.peer_proxies[target], True)
        else:
            await super().end(kind, target)

    def prove_begin(self, kind: str, target: int) -> Proof:
        if kind != PARTITION:
            return super().prove_begin(kind, target)
        return proof.judge_partition(
            proof.probe(self._peer_address(target), b"", proof.QUIET_S),
            proof.probe(self._storage_address(target), b"", proof.QUIET_S),
        )

    def prove_end(self, kind: str, target: int) -> Proof | None:
        if kind != PARTITION:
            return super().prove_end(kind, target)
        result = proof.probe(self._peer_address(target), b"", proof.QUIET_S)
        refused = result.failure == "ConnectionRefusedError"
        return Proof(not refused, f"the peers' way in accepts again: {not refused}")

    def _peer_address(self, index: int) -> str:
        return f"{self.cluster.peer_hosts[index]}:{self.cluster.storage_port}"

    def _storage_address(self, index: int) -> str:
        return f"{self.cluster.contact_points[index]}:{self.cluster.storage_port}"

    async def heal(self) -> None:
        """Also until every node's gossip sees every other UP again (a partition's
        end leaves them DOWN to each other for a few seconds)."""
        await super().heal()
        await asyncio.to_thread(self.cluster.wait_all_up, 240)

    def serve_args(self) -> list[str]:
        proxies = ",".join(f"{h}=127.0.0.1:{p}" for h, p in self.routes.items())
        return [
            "--backend", "scylla",
            "--scylla-contact-points", ",".join(self.cluster.contact_points),
            "--scylla-port", str(self.cluster.port),
            "--scylla-keyspace", self.keyspace,
            "--scylla-consistency", "QUORUM",  # conditional writes: SERIAL, the default
            "--scylla-node-proxies", proxies,
        ]  # fmt: skip

    def node(self, index: int) -> Any:
        return self.cluster.nodes[index]

    def node_pid(self, index: int, kind: str = "") -> int | None:
        pid = self.node(index).pid
        return int(pid) if pid is not None else None

    def node_address(self, index: int, kind: str = "") -> str:
        return f"{self.cluster.contact_points[index]}:{self.cluster.port}"

    async def restart_node(self, index: int) -> None:
        if self.node(index).is_running() and await asyncio.to_thread(self._up, index):
            return
        try:
            await asyncio.to_thread(self.cluster.start_node, index)
        except Exception:  # a busy machine: slower than the launcher's 240 s; once more
            await asyncio.to_thread(self.cluster.start_node, index)

    def _up(self, index: int) -> bool:
        address = self.node_address(index)
        return bool(proof.probe(address, self.probe_request, 5.0).reply)

    def close(self) -> None:
        self.cluster.stop(grace=20)
        self.cluster.kill()


class RedisTopology(Topology):
    backend = "redis"
    node_count = 1
    probe_request = proof.REDIS_PING

    def __init__(self, work: Path, toxi: tp.Toxiproxy, kind: str = "standalone") -> None:
        super().__init__(work, toxi)
        module = _redis_topologies()
        self.kind = kind
        self.sentinel: Any = None
        if kind == "sentinel":
            self.sentinel = module.SentinelTopology(work / "redis")
            self.nodes: list[Any] = self.sentinel.data_nodes
            self.node_count = 2
        else:
            self.nodes = [module.RedisNode(work / "redis")]
        self.prefix = f"mc-nemesis-{uuid.uuid4().hex[:8]}"
        self.proxy_port = 0
        self._victim: Any = None  # the master a kill-master / pause-master hit

    def fault_kinds(self) -> list[FaultKind]:
        if self.kind == "sentinel":  # faults of whichever node is master at the time
            return [FaultKind("kill-master", 1), FaultKind("pause-master", 1)]
        return super().fault_kinds()

    async def start(self) -> None:
        if self.sentinel is not None:
            await asyncio.to_thread(self.sentinel.start)
        else:
            await asyncio.to_thread(self.nodes[0].start)
            self.proxy_port = free_port()
            listen = f"127.0.0.1:{self.proxy_port}"
            self.toxi.create_proxy("redis0", listen, self.nodes[0].address)
            self.proxies.append("redis0")
            self.listen.append(listen)
        await self._initialise()

    async def _initialise(self) -> None:
        """``migrate --backend redis`` for the prefix, as an operator would before serving."""
        from backends.redis import open_link
        from backends.redis.deployment import initialise

        link = open_link(self.serve_env()["MC_REDIS_URL"])
        try:
            await initialise(link, self.prefix)
        finally:
            await link.close()

    def serve_args(self) -> list[str]:
        return ["--backend", "redis", "--redis-prefix", self.prefix]

    def serve_env(self) -> dict[str, str]:
        if self.sentinel is not None:
            return {"MC_REDIS_URL": self.sentinel.url}
        return {"MC_REDIS_URL": f"redis://127.0.0.1:{self.proxy_port}/0"}

    async def begin(self, kind: str, target: int) -> None:
        if kind in ("kill-master", "pause-master"):
            self._victim = self.sentinel.current_master()
            self._pids[(kind, target)] = _pid(self._victim)
            if kind == "kill-master":
                self._victim.kill()
            else:
                self._victim.pause()
        else:
            await super().begin(kind, target)

    async def end(self, kind: str, target: int) -> None:
        if kind == "kill-master":
            await asyncio.to_thread(self._victim.start)
        elif kind == "pause-master":
            self._victim.resume()
        else:
            await super().end(kind, target)

    def node(self, index: int) -> Any:
        return self.nodes[index]

    def node_pid(self, index: int, kind: str = "") -> int | None:
        return _pid(self._victim if kind.endswith("-master") else self.node(index))

    def node_address(self, index: int, kind: str = "") -> str:
        return str((self._victim if kind.endswith("-master") else self.node(index)).address)

    async def restart_node(self, index: int) -> None:
        if not self.node(index).running:
            await asyncio.to_thread(self.node(index).start)

    async def heal(self) -> None:
        await super().heal()
        if self.sentinel is not None:
            await asyncio.to_thread(self.sentinel.wait_replicated, 60.0)

    def close(self) -> None:
        if self.sentinel is not None:
            self.sentinel.close()
        else:
            self.nodes[0].kill()


def _pid(node: Any) -> int | None:
    """A RedisNode's pid (None when it is not running)."""
    process = getattr(node, "_process", None)
    return int(process.pid) if process is not None and process.poll() is None else None
