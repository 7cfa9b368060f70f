"""Pytest plugin and launchers: Redis with replicas, on loopback ports (``redis-server``).

* ``RedisNode``: one redis-server (AOF, fsync always) that can be killed (SIGKILL),
  paused (SIGSTOP), resumed and restarted on the same port;
* ``SentinelTopology``: a master, one replica and three Sentinels
  (``redis-server <conf> --sentinel``, quorum 2, down after 1 s, periods shortened with
  ``SENTINEL DEBUG``: see ``SENTINEL_DEBUG``); ``kill_master`` and ``wait_failover``
  force and await a failover; ``url`` is the
  ``redis+sentinel://h1:p1,h2:p2,h3:p3/<master>/0`` form the backend is to accept;
* ``RedisClusterTopology``: a Redis Cluster of 3 masters + 3 replicas built with
  ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``; ``url`` is
  ``redis+cluster://h:p,...``.

Fixtures: ``redis_sentinel`` and ``redis_cluster`` (per test: a fresh topology,
everything stopped afterwards); ``redis_sentinel_harness`` and
``redis_cluster_harness`` (the conformance suite's backends, on a fresh prefix of
one topology shared by the session). A missing ``redis-server`` fails, never skips.
(No Docker path: the topologies need several containers on one network.)
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.crc import key_slot

from tests.servers.redis_server import RedisHarness, RedisServerMissing, _ping
from toolkit.ports import free_port

MASTER_NAME = "mc"
START_TIMEOUT_S = 20.0
FAILOVER_TIMEOUT_S = 30.0
DOWN_AFTER_MS = 2000
"""Sentinel's ``down-after-milliseconds`` here. It reconnects a link at most once a
second, so at 1000 a single failed connect after a switch made a node "down"."""
# Sentinel's own periods are sized for production: it refreshes a replica's INFO every
# 10 s and waits 4 publish periods (8 s) before it turns a returning old master into a
# replica, so a rejoin took 14.5-15.6 s on an idle box and overran a 20 s wait on a
# loaded one. A stall of the timer over 2 s (a loaded box) put a Sentinel in TILT for
# 30 s, acting on nothing. Redis 7's SENTINEL DEBUG shortens them (not persisted: set at
# every start).
SENTINEL_DEBUG = (
    "info-period", "1000", "publish-period", "500",
    "tilt-trigger", "10000", "tilt-period", "5000",
)  # fmt: skip


def _executable(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RedisServerMissing(f"{name} is not installed: apt-get install -y redis-server")
    return found


class RedisNode:
    """One redis-server (or Sentinel) on 127.0.0.1:``port``; data in ``directory``."""

    def __init__(
        self, directory: Path, *extra: str, sentinel_conf: str = "", bus: bool = False
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port(offsets=(0, 10_000) if bus else (0,))  # the bus is port + 10000
        self.extra = list(extra)
        self.sentinel_conf = sentinel_conf
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def client(self) -> Redis:
        return Redis(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)

    def start(self) -> None:
        if self.running:
            return
        log = str(self.directory / "redis.log")
        if self.sentinel_conf:
            conf = self.directory / "sentinel.conf"
            if not conf.exists():  # Sentinel rewrites its file; keep what it learnt
                conf.write_text(f"port {self.port}\nbind 127.0.0.1\n{self.sentinel_conf}")
            args = [str(conf), "--sentinel", "--dir", str(self.directory), "--logfile", log]
        else:
            args = [
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                # a full sync starts at once (the default waits 5 s for more replicas)
                "--repl-diskless-sync-delay", "0",
                "--logfile", log, *self.extra,
            ]  # fmt: skip
        self._process = subprocess.Popen(
            [_executable("redis-server"), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = (
                    Path(log).read_text(errors="replace").splitlines()[-5:]
                    if Path(log).exists()
                    else []
                )
                raise RuntimeError(f"redis-server on port {self.port} exited: " + " | ".join(tail))
            if _ping(self.port):
                if self.sentinel_conf:
                    with self.client() as c:
                        c.execute_command("SENTINEL", "DEBUG", *SENTINEL_DEBUG)
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"redis-server did not answer within {START_TIMEOUT_S:.0f}s")

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self.resume()
        self._end(signal.SIGTERM)

    def pause(self) -> None:
        if self._process is not None and self.running:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None and self.running:
            self._process.send_signal(signal.SIGCONT)

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


class SentinelTopology:
    """A master, a replica and three Sentinels watching them."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or Path(tempfile.mkdtemp(prefix="mc-sentinel-"))
        self.master = RedisNode(self.directory / "r0")
        self.replica = RedisNode(self.directory / "r1")
        self.replica.extra = ["--replicaof", "127.0.0.1", str(self.master.port)]
        conf = (
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 5000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        self.sentinels = [RedisNode(self.directory / f"s{i}", sentinel_conf=conf) for i in range(3)]

    @property
    def data_nodes(self) -> list[RedisNode]:
        return [self.master, self.replica]

    @property
    def url(self) -> str:
        hosts = ",".join(s.address for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def start(self) -> None:
        for node in (self.master, self.replica, *self.sentinels):
            node.start()
        self.wait_replicated()

    def master_ports(self) -> set[int]:
        """The master's port as each running Sentinel names it (one each that answers)."""
        ports: set[int] = set()
        for s in self.sentinels:
            if not s.running:
                continue
            with contextlib.suppress(Exception), s.client() as c:
                host_port = c.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
                ports.add(int(host_port[1]))
        return ports

    def master_port(self) -> int:
        """The master's port, once every Sentinel that answers names the same one."""
        ports = self.master_ports()
        if len(ports) != 1:
            raise RuntimeError(f"the Sentinels name {sorted(ports) or 'no'} master")
        return ports.pop()

    def current_master(self) -> RedisNode:
        port = self.master_port()
        return next(n for n in self.data_nodes if n.port == port)

    def wait_replicated(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until the Sentinels agree on a master and the other node, by its own account,
        is its replica with the link up and no sync in progress, and the master lists it
        online. (Neither view is enough alone: the master may call a replica online while
        the replica still serves what it held before the sync, and the replica's "link
        up" comes before the master counts it for WAIT.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                master = self.current_master()
                with master.client() as c:
                    online = online_replicas(c.info("replication"))
                others = [n for n in self.data_nodes if n is not master]
                if all(_follows(n, master.port) and n.port in online for n in others):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the replica did not sync with the master in time: {self._roles()}")

    def _roles(self) -> str:
        seen = []
        for node in self.data_nodes:
            try:
                with node.client() as c:
                    info = c.info("replication")
                seen.append(
                    f"{node.port} {info.get('role')} of {info.get('master_port', '-')}"
                    f" link {info.get('master_link_status', '-')}"
                    f" syncing {info.get('master_sync_in_progress', '-')}"
                )
            except Exception as exc:
                seen.append(f"{node.port} {type(exc).__name__}")
        return f"Sentinels name {sorted(self.master_ports())}; " + "; ".join(seen)

    def kill_master(self) -> RedisNode:
        """SIGKILL the current master; returns it (restart it with ``start``)."""
        node = self.current_master()
        node.kill()
        return node

    def wait_failover(self, old_port: int, timeout: float = FAILOVER_TIMEOUT_S) -> int:
        """Until every Sentinel names one master other than ``old_port``; its port. (A
        Sentinel that has not heard of the failover yet would turn the promoted node back
        into a replica of the old master if that came back now.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                port = self.master_port()
                if port != old_port and self._settled_on(port):
                    return port
            time.sleep(0.1)
        raise RuntimeError(f"no failover within {timeout:.0f}s: {self._roles()}")

    def _settled_on(self, port: int) -> bool:
        """Every running Sentinel sees the master at ``port`` healthy: no failover in
        progress, not subjectively down, its own INFO saying master, a recent ping
        answered. Right after a switch each Sentinel opens new links to the nodes; one
        whose first ping went unanswered for ``down-after-milliseconds`` could start a
        second failover at once (its peers' "master down" replies about the old master
        still count towards the quorum) and promote whichever node returns first, even
        the old master with only what it alone had acknowledged."""
        for s in self.sentinels:
            if not s.running:
                continue
            try:
                with s.client() as c:
                    state = c.sentinel_master(MASTER_NAME)
            except Exception:
                return False
            if (
                state.get("port") != port
                or state.get("flags") != "master"
                or state.get("role-reported") != "master"
                or state.get("last-ok-ping-reply", DOWN_AFTER_MS) >= DOWN_AFTER_MS // 2
            ):
                return False
        return True

    def close(self) -> None:
        for node in (*self.sentinels, self.replica, self.master):
            node.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def _follows(node: RedisNode, master_port: int) -> bool:
    with node.client() as c:
        info = c.info("replication")
    return bool(
        info.get("role") == "slave"
        and info.get("master_port") == master_port
        and info.get("master_link_status") == "up"
        and info.get("master_sync_in_progress") == 0
    )


def online_replicas(master_info: dict[str, Any]) -> set[int]:
    """The ports of the replicas a master's INFO replication lists as online."""
    return {
        int(entry["port"])
        for key, entry in master_info.items()
        if key.startswith("slave") and isinstance(entry, dict) and entry.get("state") == "online"
    }


def _own_slots(nodes: str) -> tuple[int, int] | None:
    """The first slot range of the node that answered ``CLUSTER NODES`` (its "myself"
    line; the nodes' announced addresses may be proxies), if it is a master with slots."""
    for line in nodes.splitlines():
        fields = line.split()
        if len(fields) > 8 and "myself" in fields[2] and "master" in fields[2]:
            for entry in fields[8:]:
                if not entry.startswith("["):  # "[slot->-id]": a slot being migrated
                    first, _, last = entry.partition("-")
                    return int(first), int(last or first)
    return None


class RedisClusterTopology:
    """A Redis Cluster: 3 masters + 3 replicas."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or Path(tempfile.mkdtemp(prefix="mc-rcluster-"))
        cluster_args = ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                        "--cluster-config-file", "nodes.conf")  # fmt: skip
        self.nodes = [
            RedisNode(self.directory / f"n{i}", *cluster_args, bus=True) for i in range(6)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(n.address for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        result = subprocess.run(
            [_executable("redis-cli"), "--cluster", "create", *(n.address for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout[-2000:]}")
        self.wait_ok()
        self.wait_replicas_linked()

    def wait_replicas_linked(self, timeout: float = FAILOVER_TIMEOUT_S) -> None:
        """Until every master's replica acknowledges a write of it: WAIT can be met,
        and no replica that never synced is left (it would refuse to take over).

        No side's INFO is enough. A replica says "link up" before its master counts it
        online, and after a diskless full sync a master calls its replica online but
        starts the replica's command stream only on the replica's first ACK, up to a
        second later: until then a WAIT on that master gets 0 (seen on 3 fresh clusters
        of 15, with both sides reporting the link up and online). So each master writes
        a probe key of one of its own slots and WAITs for one replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._every_master_replicates(deadline):
                return
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster replicas did not link up in time")

    def _every_master_replicates(self, deadline: float) -> bool:
        """Each of the masters' probe writes acknowledged by a replica before ``deadline``."""
        replicated = 0
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.client() as c:
                    slots = _own_slots(c.execute_command("CLUSTER", "NODES"))
                    if slots is None:
                        continue  # a replica, or a master without slots
                    key = next(
                        k
                        for k in (f"topology-probe:{i}" for i in range(1_000_000))
                        if slots[0] <= key_slot(k.encode()) <= slots[1]
                    )
                    wait_ms = max(1, min(2000, int((deadline - time.monotonic()) * 1000)))
                    c.set(key, "1", px=60_000)
                    acked = int(c.execute_command("WAIT", 1, wait_ms))
                    c.delete(key)
            except Exception:
                return False
            if acked < 1:
                return False
            replicated += 1
        return replicated == len(self.nodes) // 2

    def wait_ok(self, timeout: float = FAILOVER_TIMEOUT_S) -> None:
        """Until every running node reports cluster_state:ok."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                if node.running:
                    with contextlib.suppress(Exception), node.client() as c:
                        states.append(c.execute_command("CLUSTER", "INFO").count("state:ok"))
            if states and all(states):
                return
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not reach state ok in time")

    def wait_masters(self, count: int = 3, timeout: float = FAILOVER_TIMEOUT_S) -> None:
        """Until ``count`` running nodes are masters and the cluster is ok (a failover)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.masters()) >= count:
                self.wait_ok(max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.2)
        raise RuntimeError(f"fewer than {count} masters after {timeout:.0f}s")

    def masters(self) -> list[RedisNode]:
        result = []
        for node in self.nodes:
            if node.running:
                with contextlib.suppress(Exception), node.client() as c:
                    if c.info("replication").get("role") == "master":
                        result.append(node)
        return result

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def redis_sentinel() -> Iterator[SentinelTopology]:
    try:
        topology = SentinelTopology()
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        topology.start()
        yield topology
    finally:
        topology.close()


@pytest.fixture
def redis_cluster() -> Iterator[RedisClusterTopology]:
    try:
        topology = RedisClusterTopology()
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        topology.start()
        yield topology
    finally:
        topology.close()


@contextlib.contextmanager
def _started(make: type[SentinelTopology] | type[RedisClusterTopology]) -> Iterator[Any]:
    try:
        topology = make()
    except RedisServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        topology.start()
        yield topology
    finally:
        topology.close()


@pytest.fixture(scope="session")
def redis_sentinel_session() -> Iterator[SentinelTopology]:
    with _started(SentinelTopology) as topology:
        yield topology


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[RedisClusterTopology]:
    with _started(RedisClusterTopology) as topology:
        yield topology


def _harness_on(url: str) -> Iterator[RedisHarness]:
    harness = RedisHarness(url)
    yield harness
    with contextlib.suppress(Exception):  # a topology a test broke: keys go with it
        harness.delete_keys()


@pytest.fixture
def redis_sentinel_harness(redis_sentinel_session: SentinelTopology) -> Iterator[RedisHarness]:
    """The conformance suite through Sentinel (the master it names, followed)."""
    yield from _harness_on(redis_sentinel_session.url)


@pytest.fixture
def redis_cluster_harness(redis_cluster_session: RedisClusterTopology) -> Iterator[RedisHarness]:
    """The conformance suite on a 3 + 3 Redis Cluster (keys hash-tagged per shard)."""
    yield from _harness_on(redis_cluster_session.url)
