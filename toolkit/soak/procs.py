"""The soak's ``serve`` and ``relay`` processes, optionally under ``faketime``.

Each process runs in a process group of its own: ``faketime`` forks its command and
waits, so a SIGKILL of the wrapper alone would leave the committer running. ``kill``
sends SIGKILL to the whole group and returns only once no process of the group is
left, so the fault is observed, not assumed. ``start`` waits for the process's
ready line in its log (``serving gRPC on`` for serve, ``relaying as`` for a relay).
A serve process keeps its gRPC port across restarts, so clients keep their channels.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolkit.ports import free_port

START_TIMEOUT_S = 90.0
DEATH_TIMEOUT_S = 15.0
SERVE_READY = "serving gRPC on"
RELAY_READY = "relaying as"


class ProcError(RuntimeError):
    """A process did not start, or did not die when killed."""


def faketime_prefix(offset: str) -> list[str]:
    """``faketime -f <offset>`` (real-time offset, e.g. ``+1.5s``), or ProcError."""
    binary = shutil.which("faketime")
    if binary is None:
        raise ProcError("faketime is not on PATH (Debian: apt-get install faketime)")
    return [binary, "-f", offset]


def group_alive(group: int) -> bool:
    """Whether a process of ``group`` still runs (zombies do not count: a container's
    init may be slow to reap the orphans of a killed ``faketime``)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


class Proc:
    """One ``message-committer serve`` or ``relay`` process, restartable."""

    def __init__(
        self,
        name: str,
        subcommand: str,
        args: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        prefix: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.cwd = cwd
        """Where it runs: a broken copy of the packages (``nemesis --sabotage``) shadows
        the checkout there."""
        self.subcommand = subcommand
        self.grpc_port = free_port() if subcommand == "serve" else 0
        self.http_port = free_port()
        self.args = list(args)
        self.env = dict(env)
        self.prefix = list(prefix)
        self.log_path = log_dir / f"{name}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        base = [*self.prefix, sys.executable, "-m", "service.cli", self.subcommand, *self.args]
        if self.subcommand == "serve":
            return [*base, "--grpc-address", self.target,
                    "--http-address", f"127.0.0.1:{self.http_port}"]  # fmt: skip
        return base

    def start(self) -> None:
        if self.running:
            return
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, **self.env}
        if self.subcommand == "relay":
            env["MC_RELAY_HTTP_ADDRESS"] = f"127.0.0.1:{self.http_port}"
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, cwd=self.cwd,
            )  # fmt: skip
        ready = SERVE_READY if self.subcommand == "serve" else RELAY_READY
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self._log_since(offset)
            if ready in text:
                return
            if self._process.poll() is not None:
                raise ProcError(f"{self.name} exited at start-up:\n{text[-1500:]}")
            time.sleep(0.1)
        self.kill()
        raise ProcError(f"{self.name} was not ready within {START_TIMEOUT_S:.0f}s")

    def log_size(self) -> int:
        """Bytes in the log so far: ``log_since`` reads what comes after."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        return self._log_since(offset)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the process group; ProcError unless every process of it is gone."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        group = process.pid  # start_new_session: the group id is the leader's pid
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + DEATH_TIMEOUT_S
        while time.monotonic() < deadline:
            process.poll()
            if not group_alive(group):
                process.wait(timeout=DEATH_TIMEOUT_S)
                return
            time.sleep(0.05)
        if sig != signal.SIGKILL:
            os.killpg(group, signal.SIGKILL)
            return
        raise ProcError(f"{self.name} (group {group}) still has processes after SIGKILL")
