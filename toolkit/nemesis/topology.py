"""The storage under the nemesis, with a Toxiproxy proxy in front of each storage node.

* ``ScyllaTopology``: the three-node Cassandra cluster of ``deploy/cassandra`` (RF 3,
  commitlog ``batch`` so that a kill -9 loses no acknowledged Paxos state), one proxy
  per node; replicas reach every node through its proxy (``--scylla-node-proxies``)
  at QUORUM / SERIAL.
* ``RedisTopology``: a standalone redis-server behind one proxy, or ``sentinel``:
  master + replica + 3 Sentinels (``tests/servers/redis_topologies.py``), whose URL
  form (``redis+sentinel://``) the Redis backend must support.

Fault kinds of the storage: ``kill-node`` (SIGKILL, restarted at the fault's end),
``pause-node`` (SIGSTOP / SIGCONT), and the toxics ``latency``, ``timeout`` (data
swallowed: replies to conditional writes go missing) and ``reset-peer`` on one or
more node proxies. The launchers live in the development checkout (``deploy/``,
``tests/servers/``), as the benchmark's do.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from toolkit.nemesis import toxiproxy as tp
from toolkit.nemesis.schedule import FaultKind
from toolkit.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CLUSTER_LAUNCHER = REPO / "deploy" / "cassandra" / "cassandra_cluster.py"
TOXICS = {
    "latency": lambda: tp.latency(250, 150),
    "timeout": lambda: tp.timeout(0),
    "reset-peer": lambda: tp.reset_peer(0),
}


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

    def __init__(self, work: Path, toxi: tp.Toxiproxy) -> None:
        self.work = work
        self.toxi = toxi
        self.proxies: list[str] = []  # one proxy name per node
        self._toxics: dict[tuple[str, int], str] = {}

    def fault_kinds(self) -> list[FaultKind]:
        n = self.node_count
        return [
            FaultKind("kill-node", n),
            FaultKind("pause-node", n),
            FaultKind("latency", n, most=n),
            FaultKind("timeout", n, most=max(1, n - 1)),
            FaultKind("reset-peer", n, most=max(1, n - 1)),
        ]

    async def start(self) -> None:
        raise NotImplementedError

    def serve_args(self) -> list[str]:
        raise NotImplementedError

    def serve_env(self) -> dict[str, str]:
        return {}

    async def begin(self, kind: str, target: int) -> None:
        if kind in TOXICS:
            self._toxics[(kind, target)] = self.toxi.add_toxic(self.proxies[target], TOXICS[kind]())
        elif kind == "kill-node":
            self.node(target).kill()
        elif kind == "pause-node":
            self.node(target).pause()
        else:
            raise ValueError(f"unknown storage fault {kind}")

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


class ScyllaTopology(Topology):
    backend = "scylla"
    node_count = 3

    def __init__(self, work: Path, toxi: tp.Toxiproxy, nodes: int = 3) -> None:
        super().__init__(work, toxi)
        self.node_count = nodes
        launcher = _load("mc_cassandra_cluster", CLUSTER_LAUNCHER)
        self.cluster: Any = launcher.CassandraCluster(
            work / "cassandra", nodes, commitlog_sync="batch"
        )
        self.keyspace = f"mc_nemesis_{uuid.uuid4().hex[:8]}"
        self.routes: dict[str, int] = {}

    async def start(self) -> None:
        from backends.scylla.migrate import migrate

        await asyncio.to_thread(self.cluster.start)
        for i, host in enumerate(self.cluster.contact_points):
            name = f"cql{i}"
            port = free_port()
            self.toxi.create_proxy(name, f"127.0.0.1:{port}", f"{host}:{self.cluster.port}")
            self.proxies.append(name)
            self.routes[host] = port
        await migrate(
            self.cluster.contact_points,
            port=self.cluster.port,
            keyspace=self.keyspace,
            replication=self.cluster.replication(),
            request_timeout_s=30.0,
        )

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

    async def restart_node(self, index: int) -> None:
        if not self.node(index).is_running():
            await asyncio.to_thread(self.cluster.start_node, index)

    def close(self) -> None:
        self.cluster.stop(grace=20)
        self.cluster.kill()


class RedisTopology(Topology):
    backend = "redis"
    node_count = 1

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
        if kind == "kill-master":
            self._victim = self.sentinel.current_master()
            self._victim.kill()
        elif kind == "pause-master":
            self._victim = self.sentinel.current_master()
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
