"""The soak's storage and its faults, each observed before it counts.

* redis: master + replica + 3 Sentinels (``RedisTopology(kind="sentinel")``).
  ``sentinel-failover`` asks a Sentinel for ``SENTINEL FAILOVER``; ``kill-master``
  SIGKILLs the master the Sentinels name and restarts it once they name another (it
  comes back as a replica). Both count only when the Sentinels name a new master,
  and both wait for the new master's replica to be in sync before the next fault.
* scylla: the three-node Cassandra cluster (RF 3, QUORUM / SERIAL, ``ScyllaTopology``);
  ``kill-node`` SIGKILLs one node, checks that its process is gone, restarts it and
  waits until the nodes see each other again.

A fault that did not take effect raises ``FaultNotObserved``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

from toolkit.nemesis.topology import RedisTopology, ScyllaTopology
from toolkit.nemesis.toxiproxy import Toxiproxy

FAILOVER_TIMEOUT_S = 60.0
REPLICATED_TIMEOUT_S = 90.0
DOWN_S = 3.0
"""How long a killed node stays down before its restart."""


class FaultNotObserved(RuntimeError):
    """A fault was fired but its effect did not show."""


class Storage:
    def __init__(self, backend: str, work: Path) -> None:
        self.backend = backend
        toxi = cast(Toxiproxy, _NoProxies())
        self.topology: RedisTopology | ScyllaTopology
        if backend == "redis":
            self.topology = RedisTopology(work, toxi, "sentinel")
        else:
            self.topology = ScyllaTopology(work, toxi)
        self._next_node = 0

    async def start(self) -> None:
        await self.topology.start()

    def serve_args(self) -> list[str]:
        args = self.topology.serve_args()
        if "--scylla-node-proxies" in args:  # straight to the nodes: no Toxiproxy here
            at = args.index("--scylla-node-proxies")
            del args[at : at + 2]
        return args

    def serve_env(self) -> dict[str, str]:
        env = self.topology.serve_env()
        if self.backend == "redis":
            env["MC_REDIS_WAIT_REPLICAS"] = "1"  # DESIGN §10: durable before acknowledged
        return env

    def kinds(self) -> list[str]:
        if self.backend == "redis":
            return ["sentinel-failover", "kill-master"]
        return ["kill-node"]

    async def fire(self, kind: str) -> str:
        """Fire one storage fault and wait until its effect shows; what happened."""
        if kind == "sentinel-failover":
            return await asyncio.to_thread(self._failover, False)
        if kind == "kill-master":
            return await asyncio.to_thread(self._failover, True)
        if kind == "kill-node":
            return await asyncio.to_thread(self._kill_node)
        raise ValueError(f"unknown storage fault {kind}")

    def _sentinel(self) -> Any:
        assert isinstance(self.topology, RedisTopology)
        return self.topology.sentinel

    def _failover(self, kill: bool) -> str:
        sentinel = self._sentinel()
        sentinel.wait_replicated(REPLICATED_TIMEOUT_S)
        old = sentinel.current_master()
        if kill:
            old.kill()
            if old.running:
                raise FaultNotObserved(f"the master on port {old.port} survived SIGKILL")
        else:
            self._ask_failover(sentinel)
        try:
            new_port = sentinel.wait_failover(old.port, FAILOVER_TIMEOUT_S)
        except RuntimeError as exc:
            raise FaultNotObserved(f"the Sentinels still name port {old.port}: {exc}") from None
        finally:
            if kill:
                time.sleep(DOWN_S)
                old.start()
        sentinel.wait_replicated(REPLICATED_TIMEOUT_S)
        return f"master {old.port} -> {new_port}"

    def _ask_failover(self, sentinel: Any) -> None:
        last: Exception | None = None
        for node in sentinel.sentinels:
            try:
                with node.client() as c:
                    c.execute_command("SENTINEL", "FAILOVER", _master_name())
                return
            except Exception as exc:  # e.g. INPROG: try the next Sentinel
                last = exc
        raise FaultNotObserved(f"no Sentinel accepted SENTINEL FAILOVER: {last}")

    def _kill_node(self) -> str:
        assert isinstance(self.topology, ScyllaTopology)
        cluster = self.topology.cluster
        index = self._next_node % len(cluster.nodes)
        self._next_node += 1
        node = cluster.nodes[index]
        node.kill()
        if node.is_running():
            raise FaultNotObserved(f"CQL node {index} survived SIGKILL")
        time.sleep(DOWN_S)
        began = time.monotonic()
        try:
            cluster.start_node(index)
        except Exception:  # a busy machine: slower than the launcher's 240 s; once more
            cluster.start_node(index)
        took = time.monotonic() - began
        if not node.is_running():
            raise FaultNotObserved(f"CQL node {index} did not come back")
        return f"node {index} killed, back in {took:.0f}s"

    def close(self) -> None:
        self.topology.close()


def _master_name() -> str:
    from tests.servers.redis_topologies import MASTER_NAME  # loaded by RedisTopology

    return str(MASTER_NAME)


class _NoProxies:
    """Stands in for Toxiproxy: the soak's faults are kills and failovers, not toxics,
    so the topologies' proxies are not made and the processes reach the nodes directly."""

    def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        del name, listen, upstream
