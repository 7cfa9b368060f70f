"""The servers of the process mode, each in its own OS process so it can be stalled
(SIGSTOP ... SIGCONT) while the client processes keep running.

``MemoryServerProc``: ``MemoryServers`` (one replica with its in-process relay on
a memory state) in a child process. A stall stops the whole child. A kill is
done inside it (the replica stops at once, the memory state survives, as a
durable backend's would), since killing the process would lose the state.

``RedisServerProcs``: a ``redis-server`` (AOF, fsync always) the campaign
starts on a free loopback port, and ``message-committer serve`` and
``message-committer relay`` subprocesses against it. A kill is SIGKILL of
serve and relay; a stall is SIGSTOP of serve.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Protocol

from service.domain.faults import FaultPoint, RelayPoint
from toolkit.ports import free_port

START_TIMEOUT_S = 30.0


class Servers(Protocol):
    @property
    def target(self) -> str: ...

    async def start(self) -> None: ...
    async def kill(self) -> None: ...
    async def arm(self, fault: str) -> bool: ...
    async def disarm(self) -> None: ...
    async def stall(self, seconds: float) -> None: ...
    async def close(self) -> None: ...


async def stall_process(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid`` for ``seconds``, then SIGCONT (also when cancelled meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def _fault(name: str) -> FaultPoint | RelayPoint:
    for kind in (FaultPoint, RelayPoint):
        for point in kind:
            if point.value == name:
                return point
    raise ValueError(f"unknown server fault {name}")


def memory_server_main(conn: Connection, overrides: dict[str, Any]) -> None:
    """The child: a MemoryServers driven by commands (start, kill, arm, disarm)."""
    import logging

    from toolkit.client_campaign.servers import MemoryServers

    logging.basicConfig(level=logging.CRITICAL)

    async def run() -> None:
        servers = MemoryServers(**overrides)
        loop = asyncio.get_running_loop()
        for _ in range(10_000_000):
            raw = await loop.run_in_executor(None, _recv, conn)
            if raw is None:
                break
            op = raw["op"]
            if op == "start":
                await servers.start()
            elif op == "kill":
                await servers.kill()
            elif op == "arm":
                servers.faults.arm(_fault(raw["fault"]))
            elif op == "disarm":
                servers.faults.disarm_all()
            conn.send_bytes(json.dumps({"ok": op, "port": servers.port}).encode())
        await servers.kill()

    asyncio.run(run())


def _recv(conn: Connection) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return None
    return loaded


class MemoryServerProc:
    def __init__(self, context: BaseContext, **overrides: Any) -> None:
        parent, child = context.Pipe()
        self._conn = parent
        self._process = context.Process(  # type: ignore[attr-defined]
            target=memory_server_main, args=(child, overrides), daemon=True
        )
        self._process.start()
        child.close()
        self.port = 0
        self.stalls = 0
        self._lock = asyncio.Lock()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _command(self, **command: Any) -> dict[str, Any]:
        async with self._lock:
            self._conn.send_bytes(json.dumps(command).encode())
            raw = await asyncio.wait_for(asyncio.to_thread(self._conn.recv_bytes), 60.0)
        reply: dict[str, Any] = json.loads(raw)
        self.port = int(reply["port"])
        return reply

    async def start(self) -> None:
        await self._command(op="start")

    async def kill(self) -> None:
        await self._command(op="kill")

    async def arm(self, fault: str) -> bool:
        await self._command(op="arm", fault=fault)
        return True

    async def disarm(self) -> None:
        await self._command(op="disarm")

    async def stall(self, seconds: float) -> None:
        assert self._process.pid is not None
        await stall_process(self._process.pid, seconds)
        self.stalls += 1

    async def close(self) -> None:
        self._conn.close()
        self._process.kill()
        await asyncio.to_thread(self._process.join, 10.0)


class RedisServerProcs:
    """redis-server + serve + relay subprocesses; serve keeps one gRPC port."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        executable = shutil.which("redis-server")
        if executable is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.workdir = workdir
        self.redis_port = free_port()
        self.port = free_port()
        self.stalls = 0
        self.url = f"redis://127.0.0.1:{self.redis_port}/0"
        self._redis = subprocess.Popen(
            [
                *(executable, "--port", str(self.redis_port), "--bind", "127.0.0.1"),
                *("--dir", str(workdir), "--appendonly", "yes", "--appendfsync", "always"),
                *("--save", "", "--logfile", str(workdir / "redis.log")),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._env = {**os.environ, **env, "MC_BACKEND": "redis", "MC_REDIS_URL": self.url}
        self._serve: subprocess.Popen[bytes] | None = None
        self._relay: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def initialise(self) -> None:
        """What ``message-committer migrate --backend redis`` does, for the default prefix."""
        from backends.redis import open_link
        from backends.redis.deployment import initialise

        await _wait_port(self.redis_port)
        link = open_link(self.url)
        try:
            await initialise(link, "mc", 8)
        finally:
            await link.close()

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        with (self.workdir / log).open("ab") as out:
            return subprocess.Popen(
                [*_cli(), *args],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def start(self) -> None:
        serve = ["serve", "--grpc-address", self.target, "--http-address", "127.0.0.1:0"]
        self._serve = self._spawn(serve, "serve.log")
        self._relay = self._spawn(["relay"], "relay.log")
        await _wait_port(self.port, self._serve)
        if self._relay.poll() is not None:
            raise RuntimeError("the relay exited as it started; see relay.log")

    async def kill(self) -> None:
        for p in (self._serve, self._relay):
            if p is not None and p.poll() is None:
                p.kill()
                await asyncio.to_thread(p.wait, 30)
        self._serve = self._relay = None

    async def arm(self, fault: str) -> bool:
        return False  # the server's fault points are in-process only

    async def disarm(self) -> None:
        return None

    async def stall(self, seconds: float) -> None:
        if self._serve is None:
            return
        await stall_process(self._serve.pid, seconds)
        self.stalls += 1

    async def close(self) -> None:
        await self.kill()
        self._redis.kill()
        await asyncio.to_thread(self._redis.wait, 30)


def _cli() -> list[str]:
    return [sys.executable, "-m", "service.cli"]


async def _wait_port(port: int, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError("a server process exited while starting; see its log")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {START_TIMEOUT_S:.0f} s")
