"""The real parts the A/B probes drive: a redis-server (and what a commit looks
like in it, whatever the layout) and ``serve`` processes; gRPC is in ``rpc``.

Nothing here imports the service: both trees are driven from outside, through
surfaces release 1 already had, so one probe runs unchanged against both.
Every wait is bounded; every process started here is stopped by its owner
(the ``with`` blocks of the probes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self, cast

from redis import Redis

from toolkit.ports import free_port

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
SERVICE_PASSWORD = "ab-probe-password"  # a throwaway loopback redis-server's ACL user
_SERVING = re.compile(r"serving gRPC on \S+ \(port (\d+), \w+\), HTTP on port (\d+)")


class ProbeError(RuntimeError):
    """The harness itself could not do a step (not a verdict on a tree)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one probe saw on one tree: whether the promise held, and why (one line)."""

    held: bool
    evidence: str


@dataclass(frozen=True, slots=True)
class Tree:
    """One source tree with its own venv: what ``serve`` and the CLI run from."""

    label: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    @property
    def cli(self) -> Path:
        return self.root / ".venv" / "bin" / "message-committer"


def tool(name: str) -> str:
    """A Go tool from ``.tools/bin`` (scripts/install-tools.sh) or PATH."""
    here = Path(__file__).resolve().parents[2] / ".tools" / "bin" / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise ProbeError(f"{name} is not installed: run scripts/install-tools.sh")
    return found


def clip(text: str, limit: int = 110) -> str:
    """``text`` cut at a word boundary to about ``limit`` characters."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without any MC_* setting (each probe says what it
    means) and without anything that would make one tree's venv import another
    tree's code (PYTHONPATH and the like), plus ``extra``."""
    dropped = {"LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MC_", "FAKETIME")) and k not in dropped
    }
    return {**env, **(extra or {})}


def run(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run to completion, bounded in time; output captured as text."""
    try:
        return subprocess.run(
            [str(a) for a in argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=dict(env) if env is not None else clean_env(),
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"{Path(str(argv[0])).name} did not finish in {timeout:.0f}s") from exc


# --- redis-server ----------------------------------------------------------------


class RedisServer:
    """A redis-server on a free loopback port, data in ``directory``.

    The service connects as the ACL user ``mc`` (``url``); the probes use the
    default user (``admin``) to plant data and to take a command away from the
    service (``deny``/``allow``), which is how an intent is left unfinished
    from outside: with XADD refused, a commit stops after its record.
    """

    def __init__(self, directory: Path, *config: str) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._log = directory / "redis.log"
        argv = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(directory), "--save", "", "--appendonly", "no",
            "--logfile", str(self._log), *config,
        ]  # fmt: skip
        if shutil.which("redis-server") is None:
            raise ProbeError("redis-server is not installed (apt-get install redis-server)")
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self.admin = Redis(host="127.0.0.1", port=self.port, socket_timeout=10)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if self.admin.ping():
                    break
            except Exception:  # not listening yet
                time.sleep(0.05)
        else:
            self.stop()
            raise ProbeError("redis-server did not start")
        self._acl("+@all", password=True)

    @property
    def url(self) -> str:
        return f"redis://mc:{SERVICE_PASSWORD}@127.0.0.1:{self.port}/0"

    def _acl(self, rule: str, *, password: bool = False) -> None:
        self.admin.acl_setuser(
            "mc",
            enabled=True,
            passwords=[f"+{SERVICE_PASSWORD}"] if password else None,
            keys=["*"],
            channels=["*"],
            commands=[rule],
        )

    def deny(self, command: str) -> None:
        """Take ``command`` away from the service's user (its scripts too)."""
        self._acl(f"-{command}")

    def allow(self, command: str) -> None:
        self._acl(f"+{command}")

    def stop(self) -> None:
        self.admin.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def commit_hashes(admin: Redis) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
    """Every commit hash (a hash with a state ``st``) in this Redis, whatever the
    layout: both releases keep a commit as a hash with ``st`` and, until it is
    committed, the record JSON in ``r``."""
    for key in admin.scan_iter(count=1000, _type="HASH"):
        fields: dict[bytes, bytes] = admin.hgetall(key)  # type: ignore[assignment]
        if b"st" in fields:
            yield key, fields


def commit_of(admin: Redis, cmid: str) -> tuple[bytes, dict[bytes, bytes]]:
    """The unfinished commit hash of ``cmid`` (its record names the cmid);
    ProbeError when there is none."""
    needle = b'"k":' + json.dumps(cmid).encode()
    for key, fields in commit_hashes(admin):
        if needle in fields.get(b"r", b""):
            return key, fields
    raise ProbeError(f"no unfinished commit of {cmid} in redis")


def unfinished(admin: Redis) -> int:
    """Commit hashes not (yet) committed (state rank below 3)."""
    return sum(1 for _, f in commit_hashes(admin) if f.get(b"st") != b"3")


def outbox_entries(admin: Redis, message_id: str) -> int:
    """Outbox entries of one message id, over every stream of this Redis."""
    count = 0
    for key in admin.scan_iter(count=1000, _type="STREAM"):
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], admin.xrange(key))
        count += sum(1 for _, entry in entries if entry.get(b"m") == message_id.encode())
    return count


# --- serve processes -------------------------------------------------------------


@dataclass
class Serve:
    """``message-committer serve`` of one tree on free loopback ports."""

    tree: Tree
    args: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    wrapper: Sequence[str] = ()
    log_path: Path = Path("serve.log")
    process: subprocess.Popen[bytes] | None = None
    grpc_port: int = 0
    http_port: int = 0

    def start(self) -> Self:
        if not self.try_start():
            raise ProbeError(f"{self.tree.label} serve did not start: {self.last_line()}")
        return self

    def try_start(self) -> bool:
        """Start and wait until it serves (True) or exits first (False, ``exit_code``)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*self.wrapper, str(self.tree.cli), "serve", *self.args,
                 "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=clean_env(self.env), start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = _SERVING.search(self.log())
            if match:
                self.grpc_port, self.http_port = int(match.group(1)), int(match.group(2))
                return True
            if self.process.poll() is not None:
                return False
            time.sleep(0.05)
        self.stop()
        raise ProbeError(f"{self.tree.label} serve neither served nor exited in time")

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def last_line(self) -> str:
        lines = [line for line in self.log().splitlines() if line.strip()]
        return lines[-1][:200] if lines else "(no output)"

    def stop(self) -> None:
        """SIGTERM to the process group (a faketime wrapper's child too), then kill."""
        p = self.process
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def setup_redis(tree: Tree, url: str) -> str:
    """Prepare a new Redis the way this tree wants: ``migrate --backend redis`` where
    the tree has it (a deliberate step), nothing where ``serve`` initialises an
    empty Redis by itself (release 1)."""
    env = clean_env({"MC_REDIS_URL": url})
    done = run([tree.cli, "migrate", "--backend", "redis"], env=env, timeout=60)
    if done.returncode == 0:
        return "migrate --backend redis"
    helped = run([tree.cli, "migrate", "--help"], env=env, timeout=60)
    if "redis" not in helped.stdout.lower():
        return "none (serve initialises an empty Redis)"
    raise ProbeError(f"{tree.label} migrate --backend redis failed: {done.stderr.strip()[:200]}")
