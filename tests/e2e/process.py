"""Running the real ``message-committer`` command as a subprocess, for the e2e tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
_SERVING = re.compile(r"serving gRPC on \S+ \(port (\d+), \w+\), HTTP on port (\d+)")
_RELAYING = re.compile(
    r"relaying as (\S+) on the \w+ backend \((\d+) partitions\), HTTP on port (\d+)"
)


def command() -> list[str]:
    """The installed console script (beside this interpreter), else ``python -m service.cli``."""
    script = Path(sys.executable).parent / "message-committer"
    return [str(script)] if script.exists() else [sys.executable, "-m", "service.cli"]


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one command to completion (bounded to 60 s)."""
    return subprocess.run(
        [*command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def run_cli_bounded(
    args: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one long command (a campaign) to completion within ``timeout`` seconds."""
    return subprocess.run(
        [*command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


class ServeProcess:
    """A ``serve`` process on free loopback ports; its log goes to a temp file."""

    def __init__(
        self,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        argv0: Sequence[str] | None = None,
    ) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="mc-serve-", suffix=".log", delete=False)  # noqa: SIM115
        base = [
            "serve",
            "--backend",
            "memory",
            "--grpc-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
            "--readiness-interval",
            "100ms",
        ]
        self.process = subprocess.Popen(
            [*(argv0 or command()), *base, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.grpc_port, self.http_port = self._wait_serving()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def _wait_serving(self) -> tuple[int, int]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = _SERVING.search(self.log())
            if match:
                return int(match.group(1)), int(match.group(2))
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        text = self.log()
        self.close()  # its log file too: left open, the collector would report it later
        raise RuntimeError(f"serve did not start within {START_TIMEOUT_S:.0f} s:\n{text}")

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        self.kill()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


class RelayProcess:
    """A ``relay`` process (its HTTP side on a free loopback port); log in a temp file."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="mc-relay-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            [*command(), "relay", "--relay-http-address", "127.0.0.1:0", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.owner, self.partitions, self.http_port = self._wait_relaying()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def _wait_relaying(self) -> tuple[str, int, int]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = _RELAYING.search(self.log())
            if match:
                return match.group(1), int(match.group(2)), int(match.group(3))
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        text = self.log()
        self.close()  # its log file too: left open, the collector would report it later
        raise RuntimeError(f"relay did not start within {START_TIMEOUT_S:.0f} s:\n{text}")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        self.kill()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
