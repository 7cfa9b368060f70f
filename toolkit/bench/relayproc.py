"""``message-committer relay`` as a process beside the bench's server (Redis, Scylla).

What users run on a shared backend is a server and a relay; the sustained
phase measures that. The relay gets the server's backend settings through
``MC_*`` variables (the Redis URL never on a command line), its HTTP side on
a free loopback port, and is ready once its ``/readyz`` answers 200 (its first
lease round reached the backend). ``stop`` sends SIGTERM (the relay releases
its leases) and kills it if it does not end in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import urllib.error
import urllib.request

from service.config import ServiceConfig
from toolkit.bench.driver import BenchError
from toolkit.ports import free_port

READY_S = 60.0
STOP_S = 15.0
POLL_S = 0.2


def relay_environment(config: ServiceConfig, http_port: int) -> dict[str, str]:
    """The ``MC_*`` variables that point a relay at the server's backend."""
    env = {
        "MC_BACKEND": config.backend,
        "MC_RELAY_HTTP_ADDRESS": f"127.0.0.1:{http_port}",
        "MC_LOG_LEVEL": "ERROR",
    }
    if config.backend == "redis":
        env["MC_REDIS_URL"] = config.redis_url
        env["MC_REDIS_PREFIX"] = config.redis_prefix
        replicas = config.redis_wait_replicas
        env["MC_REDIS_WAIT_REPLICAS"] = "auto" if replicas is None else str(replicas)
    elif config.backend == "scylla":
        env["MC_SCYLLA_CONTACT_POINTS"] = ",".join(config.scylla_contact_points)
        env["MC_SCYLLA_PORT"] = str(config.scylla_port)
        env["MC_SCYLLA_KEYSPACE"] = config.scylla_keyspace
    return env


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class RelayProcess:
    """One relay process for the time of a phase."""

    def __init__(self, config: ServiceConfig) -> None:
        self._config = config
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        port = free_port()
        env = {**os.environ, **relay_environment(self._config, port)}
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.relay_main",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self._process.returncode is not None:
                raise BenchError(f"the relay process exited with {self._process.returncode}")
            if await asyncio.to_thread(_ready, port):
                return
            await asyncio.sleep(POLL_S)
        await self.stop()
        raise BenchError(f"the relay process was not ready within {READY_S:.0f} s")

    def cpu_s(self) -> float:
        """CPU seconds the relay process used so far (Linux /proc; 0 when unknown)."""
        process = self._process
        if process is None:
            return 0.0
        try:
            with open(f"/proc/{process.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_S)
        except TimeoutError:
            process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), STOP_S)
