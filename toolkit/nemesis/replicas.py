"""Service replicas: ``message-committer serve`` subprocesses on fixed loopback ports.

Each replica keeps its gRPC and HTTP ports across restarts, so clients keep their
channels. ``kill`` is SIGKILL (a crash), ``pause``/``resume`` are SIGSTOP/SIGCONT;
``start`` waits for the "serving gRPC" log line. Extra environment (``faketime``'s
``LD_PRELOAD`` and ``FAKETIME``: a real clock skew of the whole process) is given at a
restart; ``supports`` tells whether this build's code mentions a test-only setting.
A replica given a ``root`` runs ``python -m service.cli`` from that directory (a
sabotaged copy, see ``sabotage.py``). ``events`` is what the replica's backend reported in
``message_committer_backend_events_total`` (Scylla's ``direct_timeout``: proof that
the direct path's own timeout ran), over every process it was: each is scraped
before it is stopped or killed, and counters start again with the next one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolkit.ports import free_port

START_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 15.0
SERVING = "serving gRPC on"
REPO = Path(__file__).resolve().parents[2]
SCRAPE_TIMEOUT_S = 1.0
_EVENT = re.compile(r'^message_committer_backend_events_total\{kind="([^"]+)"\} ([0-9.e+]+)$')


def backend_events(metrics_text: str) -> Counter[str]:
    """The ``message_committer_backend_events_total`` counts of a /metrics page."""
    found: Counter[str] = Counter()
    for line in metrics_text.splitlines():
        match = _EVENT.match(line)
        if match:
            found[match.group(1)] += int(float(match.group(2)))
    return found


def supports(text: str, package: str = "service") -> bool:
    """Whether this build's ``package`` source mentions ``text`` (an environment variable
    it reads, a URL scheme it accepts): test-only hooks that builds may lack."""
    return any(text in p.read_text(errors="replace") for p in (REPO / package).rglob("*.py"))


def serve_command(root: Path | None = None) -> list[str]:
    if root is not None:
        return [sys.executable, "-m", "service.cli"]
    script = Path(sys.executable).parent / "message-committer"
    return [str(script)] if script.exists() else [sys.executable, "-m", "service.cli"]


class Replica:
    """One ``serve`` process; its log appends to ``<log_dir>/replica<i>.log``."""

    def __init__(
        self,
        index: int,
        args: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        root: Path | None = None,
    ) -> None:
        self.index = index
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.args = list(args)
        self.env = dict(env)
        self.extra_env: dict[str, str] = {}
        self.root = root
        self.log_path = log_dir / f"replica{index}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._banked: Counter[str] = Counter()
        """Events of the earlier processes of this replica."""

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self.running else None

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        """The replica's log from byte ``offset`` on (every process of it)."""
        return self._log_since(offset)

    def start(self) -> None:
        if self.running:
            return
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [
            *serve_command(self.root),
            "serve",
            *self.args,
            "--grpc-address",
            self.target,
            "--http-address",
            f"127.0.0.1:{self.http_port}",
        ]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                cwd=self.root,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if SERVING in self._log_since(offset):
                return
            if self._process.poll() is not None:
                tail = self._log_since(offset)[-1500:]
                raise RuntimeError(f"replica {self.index} exited at start-up:\n{tail}")
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"replica {self.index} did not serve within {START_TIMEOUT_S:.0f}s")

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env, **self.extra_env}
        if self.root is not None:  # the copy first, ahead of the installed packages
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(self.root), env.get("PYTHONPATH")])
            )
        return env

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _scrape(self) -> Counter[str]:
        """This process's backend events (empty when it does not answer)."""
        if not self.running:
            return Counter()
        url = f"http://127.0.0.1:{self.http_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                return backend_events(response.read().decode(errors="replace"))
        except OSError:
            return Counter()

    def events(self) -> Counter[str]:
        """Backend events over every process of this replica so far."""
        return self._banked + self._scrape()

    def kill(self) -> None:
        self._banked += self._scrape()
        self._signal_and_wait(signal.SIGKILL)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)
        self._banked += self._scrape()
        self._signal_and_wait(signal.SIGTERM)

    def pause(self) -> None:
        if self.running and self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running and self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def restart(self, extra_env: Mapping[str, str] | None = None) -> None:
        self.stop()
        if extra_env is not None:
            self.extra_env = dict(extra_env)
        self.restarts += 1
        self.start()

    def _signal_and_wait(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
