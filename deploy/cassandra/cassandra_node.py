"""Throwaway single-node Apache Cassandra 5.0 server for tests (a CQL stand-in for ScyllaDB).

The server jars come from Maven Central (see pom.xml next to this file) and are cached in
~/.cache/message-committer/cassandra-<version>/lib (override with CASSANDRA_JARS_DIR).
Needs Java 17 (JAVA, else JAVA_HOME/bin/java, else java on PATH) and, for the first
download, Maven. Everything binds to 127.0.0.1 on free ports; JMX is off.

    python deploy/cassandra/cassandra_node.py fetch
    python deploy/cassandra/cassandra_node.py start [--data-dir D] [--port P]

Heap: CASSANDRA_HEAP (default 1G); more JVM flags: CASSANDRA_JVM_EXTRA (space-separated).
Logs: <data dir>/logs/{system,stdout}.log.
Several nodes on loopback aliases, one or two data centres: cassandra_cluster.py.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn, Self

try:
    from toolkit.ports import free_port as reserved_port
except ImportError:  # run as a script outside the project's environment
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from toolkit.ports import free_port as reserved_port

CASSANDRA_VERSION = "5.0.9"  # keep in sync with pom.xml
HOST = "127.0.0.1"
# Both are logged by 5.0 once CQL is up; the second one only after the port bind succeeded.
READY_LINES = ("Starting listening for CQL clients", "Startup complete")
HERE = Path(__file__).resolve().parent
RACKDC = "cassandra-rackdc.properties"  # GossipingPropertyFileSnitch's dc/rack, beside the yaml

# JVM flags: the JPMS and netty parts of Cassandra's conf/jvm17-server.options, plus a
# few from jvm-server.options. (-XX:+AlwaysPreTouch / big heaps left out on purpose.)
_BASE = """-Xss256k -XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxTenuringThreshold=1
    -XX:MaxGCPauseMillis=300 -XX:+PerfDisableSharedMem -XX:+ExitOnOutOfMemoryError
    -ea -da:net.openhft... -Djava.net.preferIPv4Stack=true -Djdk.attach.allowAttachSelf=true
    -Dio.netty.tryReflectionSetAccessible=true -Dio.netty.allocator.useCacheForAllThreads=true
    -Dio.netty.allocator.maxOrder=11 -Dcassandra-foreground=yes
    -Dcassandra.skip_wait_for_gossip_to_settle=0 -Dcassandra.ring_delay_ms=1000"""
_EXPORTS = """java.base/jdk.internal.misc java.management.rmi/com.sun.jmx.remote.internal.rmi
    java.rmi/sun.rmi.registry java.rmi/sun.rmi.server java.sql/java.sql java.base/java.lang.ref
    jdk.unsupported/sun.misc jdk.compiler/com.sun.tools.javac.file jdk.attach/sun.tools.attach"""
_OPENS = """java.base/java.lang.module java.base/jdk.internal.loader java.base/jdk.internal.ref
    java.base/jdk.internal.reflect java.base/jdk.internal.math java.base/jdk.internal.module
    java.base/jdk.internal.util.jar jdk.management/com.sun.management.internal
    java.base/sun.nio.ch java.base/java.io java.base/java.lang.reflect
    jdk.compiler/com.sun.tools.javac java.base/java.lang java.base/java.util"""
_JVM_FLAGS = [
    *_BASE.split(),
    *(f"--add-exports={m}=ALL-UNNAMED" for m in _EXPORTS.split()),
    *(f"--add-opens={m}=ALL-UNNAMED" for m in _OPENS.split()),
]
# No -Dcassandra.jmx.local.port / .remote.port: Cassandra then starts no JMX server.


class CassandraError(RuntimeError):
    """The node failed to start (the message carries the log tail) or Maven failed."""


def jars_dir() -> Path:
    if env := os.environ.get("CASSANDRA_JARS_DIR"):
        return Path(env).expanduser().resolve()
    cache = Path.home() / ".cache" / "message-committer"
    return cache / f"cassandra-{CASSANDRA_VERSION}" / "lib"


def ensure_jars(timeout: float = 1800) -> Path:
    """Download Cassandra and its runtime deps with Maven, once; return the lib dir."""
    lib = jars_dir()
    marker = lib / ".complete"
    if marker.exists():
        return lib
    lib.mkdir(parents=True, exist_ok=True)
    with open(lib.parent / f".{lib.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be downloading right now
        if marker.exists():
            return lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise CassandraError("Maven ('mvn') is needed to download the Cassandra jars")
        cmd = [mvn, "-q", "-B", "-f", str(HERE / "pom.xml"), "dependency:copy-dependencies"]
        cmd += [f"-Dcassandra.version={CASSANDRA_VERSION}", f"-Dcassandra.lib.dir={lib}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if res.returncode or not (lib / f"cassandra-all-{CASSANDRA_VERSION}.jar").exists():
            out = (res.stdout + res.stderr)[-6000:]
            raise CassandraError(f"maven failed (exit {res.returncode}):\n{out}")
        marker.write_text(f"cassandra-all {CASSANDRA_VERSION}\n")
    return lib


def _java() -> str:
    if java := os.environ.get("JAVA"):
        return java
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def free_port(*avoid: int, host: str = HOST) -> int:
    """A free port on ``host``, reserved for this process and outside the kernel's
    ephemeral range (``toolkit/ports.py``: a port from bind-to-0 can be taken by any
    outgoing connection before the node binds it)."""
    while True:
        port = reserved_port(host)
        if port not in avoid:
            return port


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            tail = f.read().decode(errors="replace").splitlines()[-lines:]
        return "\n".join(line[:400] for line in tail)  # config/classpath lines are huge
    except OSError:
        return f"<no {path.name}>"


_live: set[CassandraNode] = set()


@atexit.register
def _kill_leftovers() -> None:
    for node in list(_live):
        node.kill()


@dataclass(frozen=True)
class Placement:
    """Where a node sits in a cluster (cassandra_cluster.py fills it in; a lone node
    keeps the defaults: its own seed, token 0, SimpleSnitch)."""

    seeds: str = ""
    """host:storage_port of the seed(s); empty: the node is its own seed."""
    initial_token: str = "0"
    dc: str = ""
    """Data centre (GossipingPropertyFileSnitch); empty: SimpleSnitch."""
    rack: str = "rack1"
    broadcast: str = ""
    """The address peers reach this node's storage port at (a fault proxy in front of
    it, on the same port); empty: ``listen_address``. Seeds name broadcast addresses."""


@dataclass(frozen=True)
class Sizing:
    """Heap and thread pools; the defaults suit one node on a 2-core box."""

    heap: str = ""
    """-Xms/-Xmx; empty: CASSANDRA_HEAP, else 1G."""
    concurrent_reads: int = 8
    concurrent_writes: int = 8
    compaction_mib_per_s: int = 64
    native_transport_max_threads: int = 128
    jvm_extra: tuple[str, ...] = ()


class CassandraNode:
    """One Cassandra node on a loopback address (127.0.0.1 unless ``host`` says
    otherwise). Ports are kept in <data dir>/ports.json, so restart() - or a new
    CassandraNode on the same data dir - reuses them.

    commitlog_sync="periodic" (fsync every 10s, ScyllaDB's default too) means kill() can
    lose the last seconds of acknowledged writes; use "batch" for crash-durability tests.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        port: int | None = None,
        *,
        commitlog_sync: Literal["periodic", "batch"] = "periodic",
        host: str = HOST,
        storage_port: int | None = None,
        placement: Placement | None = None,
        sizing: Sizing | None = None,
        extra_config: str = "",
    ) -> None:
        """``extra_config``: cassandra.yaml lines appended as they are (e.g. a test's
        ``client_encryption_options``)."""
        self.extra_config = extra_config
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="cassandra-")).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._host = host
        ports_file = self.data_dir / "ports.json"
        saved = json.loads(ports_file.read_text()) if ports_file.exists() else {}
        self._port: int = port or saved.get("native") or free_port(host=host)
        self.storage_port: int = (
            storage_port or saved.get("storage") or free_port(self._port, host=host)
        )
        ports_file.write_text(json.dumps({"native": self._port, "storage": self.storage_port}))
        self.commitlog_sync = commitlog_sync
        self.placement = placement or Placement()
        self.sizing = sizing or Sizing()
        self.log_path = self.data_dir / "logs" / "system.log"  # Cassandra's log (logback.xml)
        self.stdout_path = self.data_dir / "logs" / "stdout.log"  # java's stdout + stderr
        self.heap = self.sizing.heap or os.environ.get("CASSANDRA_HEAP", "1G")
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """Native (CQL) transport port."""
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        d, q = self.data_dir, json.dumps  # JSON strings are valid YAML scalars
        conf = d / "conf" / "cassandra.yaml"
        conf.parent.mkdir(parents=True, exist_ok=True)
        sync = "commitlog_sync: batch"
        if self.commitlog_sync == "periodic":
            sync = "commitlog_sync: periodic\ncommitlog_sync_period: 10000ms"
        where, size = self.placement, self.sizing
        snitch = "GossipingPropertyFileSnitch" if where.dc else "SimpleSnitch"
        if where.dc:
            (conf.parent / RACKDC).write_text(
                f"dc={where.dc}\nrack={where.rack}\nprefer_local=false\n"
            )
        seeds = where.seeds or f"{self.host}:{self.storage_port}"
        conf.write_text(f"""\
cluster_name: message-committer-test
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: {snitch}
num_tokens: 1
initial_token: {where.initial_token}
auto_bootstrap: false
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seeds}"
listen_address: {self.host}
{f"broadcast_address: {where.broadcast}" if where.broadcast else ""}
rpc_address: {self.host}
storage_port: {self.storage_port}
native_transport_port: {self._port}
start_native_transport: true
data_file_directories: [{q(str(d / "data"))}]
commitlog_directory: {q(str(d / "commitlog"))}
saved_caches_directory: {q(str(d / "saved_caches"))}
hints_directory: {q(str(d / "hints"))}
cdc_raw_directory: {q(str(d / "cdc_raw"))}
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
paxos_variant: v2
{sync}
commitlog_segment_size: 16MiB
auto_snapshot: false
hinted_handoff_enabled: false
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
key_cache_size: 8MiB
counter_cache_size: 0MiB
file_cache_size: 32MiB
prepared_statements_cache_size: 8MiB
concurrent_reads: {size.concurrent_reads}
concurrent_writes: {size.concurrent_writes}
concurrent_counter_writes: 4
concurrent_compactors: 1
compaction_throughput: {size.compaction_mib_per_s}MiB/s
native_transport_max_threads: {size.native_transport_max_threads}
{self.extra_config}
""")
        return conf

    def _command(self, lib: Path, conf: Path) -> list[str]:
        jamm = sorted(lib.glob("jamm-*.jar"))  # cassandra.in.sh loads jamm as an agent
        return [
            _java(),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            *_JVM_FLAGS,
            *self.sizing.jvm_extra,
            *os.environ.get("CASSANDRA_JVM_EXTRA", "").split(),
            f"-Dcassandra.initial_token={self.placement.initial_token}",
            f"-Dcassandra-rackdc.properties={(conf.parent / RACKDC).as_uri()}",
            *[f"-javaagent:{jar}" for jar in jamm[-1:]],
            f"-Dcassandra.config={conf.as_uri()}",
            f"-Dcassandra.storagedir={self.data_dir}",
            f"-Dcassandra.logdir={self.data_dir / 'logs'}",
            f"-Djava.io.tmpdir={self.data_dir / 'tmp'}",  # lz4/snappy unpack .so files there
            f"-Dlogback.configurationFile={HERE / 'logback.xml'}",
            "-cp",
            f"{lib}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ]

    def start(self, timeout: float = 180) -> None:
        """Start the node and block until CQL clients can connect."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the JVM and return at once (``wait_ready`` waits for CQL): a cluster
        launches its nodes side by side."""
        if self.is_running():
            raise CassandraError(f"already running (pid {self.pid})")
        for port in (self._port, self.storage_port):
            with socket.socket() as s:  # fail fast (and clearly) if a port is taken
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.host, port))
                except OSError as e:
                    raise CassandraError(f"port {self.host}:{port} is not free: {e}") from e
        cmd = self._command(ensure_jars(), self._write_config())
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "tmp").mkdir(exist_ok=True)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.log_offset = log_offset  # where this run's lines begin (cassandra_cluster.py)
        with open(self.stdout_path, "ab") as out:
            self._proc = subprocess.Popen(
                cmd, cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _live.add(self)

    def wait_ready(self, timeout: float = 180) -> None:
        """Block until the launched node takes CQL clients; kill it and raise
        CassandraError when it exits or is not ready within ``timeout``."""
        if self._proc is None:
            raise CassandraError("wait_ready follows launch")
        log_offset = self.log_offset
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._fail(f"java exited with code {self._proc.returncode} during start-up")
            if self._log_says_ready(log_offset) and self._port_open():
                return
            time.sleep(0.25)
        self.kill()
        self._fail(f"was not ready within {timeout:.0f}s")

    def _log_says_ready(self, offset: int) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return False
        return all(line.encode() in text for line in READY_LINES)

    def wait_gossip_port(self, timeout: float = 180) -> None:
        """Block until the launched node's storage (gossip) port takes connections:
        from then on it answers the shadow round of a node that starts beside it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                self.wait_ready(0)  # raises, with the log tail
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.storage_port), 1),
            ):
                return
            time.sleep(0.25)
        self.kill()
        self._fail(f"did not open its storage port within {timeout:.0f}s")

    def _port_open(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.host, self._port), 1):
            return True
        return False

    def _fail(self, why: str) -> NoReturn:
        _live.discard(self)
        raise CassandraError(
            f"Cassandra {why} (data dir {self.data_dir})\n"
            f"--- {self.log_path} (tail) ---\n{_tail(self.log_path, 40)}\n"
            f"--- {self.stdout_path} (tail) ---\n{_tail(self.stdout_path, 15)}"
        )

    def stop(self, grace: float = 30) -> None:
        """SIGTERM (Cassandra drains/flushes on it), then SIGKILL after `grace` seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused JVM would never see the SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the node (simulated crash)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        _live.discard(self)

    def pause(self) -> None:
        """SIGSTOP the node: it stops answering but keeps its sockets (a hung process)."""
        if self.is_running() and self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused node."""
        if self.is_running() and self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def rss_bytes(self) -> int:
        """Resident memory of the JVM (0 when not running), from /proc."""
        if not self.is_running() or self.pid is None:
            return 0
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0

    def restart(self, timeout: float = 180) -> None:
        """stop() then start() on the same data dir and ports; data is preserved."""
        self.stop()
        self.start(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="only download the jars")
    start = sub.add_parser("start", help="run a node in the foreground until SIGINT/SIGTERM")
    start.add_argument("--data-dir", type=Path, help="default: a new temp dir")
    start.add_argument("--port", type=int, help="native (CQL) port; default: a free one")
    start.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    if args.cmd == "fetch":
        print(ensure_jars())
        return 0

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    node = CassandraNode(args.data_dir, args.port)
    try:
        node.start(args.timeout)
        print(f"{node.host}:{node.port}", flush=True)
        print(f"pid {node.pid}, data dir {node.data_dir}", flush=True)
        while not stopping and node.is_running():
            time.sleep(0.5)
        if not stopping:
            print(f"Cassandra exited unexpectedly, see {node.log_path}", file=sys.stderr)
            return 1
    finally:
        node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
