"""Helpers of the process-fault tests.

* ``Service``: the real ``message-committer serve`` subprocess of one test,
  which can be killed with SIGKILL and started again on the same gRPC port
  (clients keep their target and reconnect), and whose health a test polls;
* ``unfinished``: the intents not yet COMMITTED, read with a direct backend
  connection of the test's own (not through the service);
* ``verify``: DESIGN §7 over everything a ``LoadDriver`` was told, plus the
  checks a process fault calls for (see its docstring);
* ``Report``: the numbers a test prints (``pytest -s`` or ``-rP`` shows them).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Self

from grpc import aio

from service.client import CommitClient
from service.domain.errors import CommitError
from service.domain.ids import CommitKey
from service.domain.model import RecoveryItem
from service.domain.ports import Backend
from tests.e2e.process import ServeProcess
from tests.faults.load import CHANNEL_OPTIONS, LoadDriver, LoadLog, conversations_of
from toolkit.campaign.invariants import check_invariants, check_recovered, read_history

OpenBackend = Callable[[], AbstractAsyncContextManager[Backend]]

# Every serve process of these tests: no send quota (the load is the point), a
# short readiness probe, a short drain. Recovery settings come from each test.
COMMON_ENV = {
    "MC_SENDER_RATE_PER_S": "0",
    "MC_READINESS_TIMEOUT": "500ms",
    "MC_SHUTDOWN_GRACE": "1s",
}
START_ATTEMPTS = 3
SCAN_LIMIT = 100_000
SCAN_HORIZON_MS = 3_600_000  # "older than an hour from now": every intent there is
MAX_PROBLEMS = 25
_SEVERE = re.compile(r" (ERROR|CRITICAL) ")  # serve's text log: "<time> LEVEL <logger>: ..."
POLL_S = 0.05


def now_ms() -> int:
    return int(time.time() * 1000)


class Service:
    """One test's ``serve`` subprocess: started, killed with SIGKILL and started again
    on the same gRPC port (the HTTP port is new each time)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str]) -> None:
        self._args = list(args)
        self._env = {**COMMON_ENV, **env}
        self._processes: list[ServeProcess] = []
        self.port = 0
        self.starts = 0
        self.kills = 0
        self._health: CommitClient | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:  # pytest shows what was printed next to the failure
            print(self.logs(tail_lines=60))
        await self.close()

    @property
    def current(self) -> ServeProcess:
        if not self._processes:
            raise RuntimeError("the service was never started")
        return self._processes[-1]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return bool(self._processes) and self.current.process.poll() is None

    async def start(self) -> float:
        """Start serve (in a thread: the clients keep running); returns the seconds it took."""
        if self.running:
            raise RuntimeError("the service is already running")
        began = time.monotonic()
        last: RuntimeError | None = None
        for _ in range(START_ATTEMPTS):  # a just-freed port may take a moment
            args = [*self._args, "--grpc-address", f"127.0.0.1:{self.port}"]
            try:
                process = await asyncio.to_thread(ServeProcess, args, self._env)
            except RuntimeError as exc:
                last = exc
                await asyncio.sleep(0.5)
                continue
            self._processes.append(process)
            self.port = process.grpc_port
            self.starts += 1
            if self._health is None:
                channel = aio.insecure_channel(self.target, options=list(CHANNEL_OPTIONS))
                self._health = CommitClient(channel)
            return time.monotonic() - began
        raise RuntimeError(f"serve did not start in {START_ATTEMPTS} attempts") from last

    def kill(self) -> None:
        """SIGKILL the running process (kill -9) and reap it."""
        if not self.running:
            raise RuntimeError("the service is not running")
        self.current.kill()
        self.kills += 1

    async def health(self) -> str | None:
        """The server's health status name, or None when it does not answer."""
        if self._health is None:
            return None
        try:
            return await self._health.health()
        except CommitError:
            return None

    async def wait_health(self, status: str, timeout_s: float) -> float:
        """Poll health until it is ``status``; returns the seconds waited."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        seen: str | None = None
        while loop.time() - began < timeout_s:
            seen = await self.health()
            if seen == status:
                return loop.time() - began
            await asyncio.sleep(POLL_S)
        raise AssertionError(f"health stayed {seen} instead of {status} for {timeout_s:.0f}s")

    async def metric(self, name: str) -> float:
        """One unlabelled sample of the running process's /metrics."""
        url = f"{self.current.http}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())

        text = await asyncio.to_thread(get)
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        if match is None:
            raise AssertionError(f"{name} is not in /metrics")
        return float(match.group(1))

    def logs(self, tail_lines: int = 30) -> str:
        """Every process's log, oldest first, for failure messages: each ERROR or
        CRITICAL line wherever it is (an unexpected exception's type is one, and a
        run under faults logs far more than its tail shows), then the tail."""
        parts = []
        for n, process in enumerate(self._processes, 1):
            lines = process.log().splitlines()
            head = lines[:-tail_lines] if tail_lines else lines
            severe = [line for line in head if _SEVERE.search(line)]
            tail = lines[-tail_lines:] if tail_lines else []
            parts.append(
                f"--- serve process {n}: {len(severe)} earlier ERROR/CRITICAL lines ---\n"
                + "\n".join([*severe[-200:], "--- its last lines ---", *tail])
            )
        return "\n".join(parts)

    async def close(self) -> None:
        """Kill every process still running and delete the logs."""
        if self._health is not None:
            await self._health.close()
        for process in self._processes:
            process.close()


async def unfinished(open_backend: OpenBackend) -> list[RecoveryItem]:
    """Every intent not COMMITTED yet, through a direct backend connection."""
    async with open_backend() as backend:
        return await backend.store.scan_recoverable_commits(now_ms() + SCAN_HORIZON_MS, SCAN_LIMIT)


async def verify(backend: Backend, log: LoadLog, reader: str) -> list[str]:
    """Violations, after recovery and ``settle``; an empty list means all hold.

    * DESIGN §7 invariants 1-4 and 6 (``check_invariants``) over every ACK
      the clients were given, and 5 (``check_recovered``) for every intent,
      whatever its age: nothing is left unfinished;
    * every key the clients sent was ACKed, and none met a definitive error;
    * no (conversation, seq) was ACKed to two keys;
    * history holds nothing but the keys sent, each once, with its content
      (so nothing was committed twice under two message ids, and no ACKed
      commit was lost).
    """
    ledger = log.ledger()
    conversations = list(conversations_of(log))
    for tenant, conversation in conversations:
        ledger.conversation(tenant, conversation, reader)
    problems = await check_invariants(backend, ledger)
    problems += await check_recovered(backend, now_ms() + SCAN_HORIZON_MS)
    for key, label in log.definitive_errors().items():
        problems.append(f"{key} met a definitive error {label}")
    for entry in log.unacked():
        if entry.definitive is None:
            problems.append(f"{entry.request.key} was never ACKed")
    holders: defaultdict[tuple[str, str, int], set[CommitKey]] = defaultdict(set)
    for key, entry in log.keys.items():
        for ack in entry.acks:
            holders[(key.tenant, ack.conversation, ack.seq)].add(key)
    for (tenant, conversation, seq), keys in holders.items():
        if len(keys) > 1:
            problems.append(f"{tenant}/{conversation} seq {seq} was ACKed to {len(keys)} keys")
    for tenant, conversation in conversations:
        records = await read_history(backend, tenant, conversation, reader)
        sent = {
            key: entry
            for key, entry in log.keys.items()
            if entry.request.conversation == conversation
        }
        seen: set[CommitKey] = set()
        for record in records:
            key = CommitKey(tenant, record.sender, record.cmid)
            sent_as = sent.get(key)
            if sent_as is None:
                problems.append(f"{tenant}/{conversation} seq {record.seq}: a key never sent")
            elif key in seen:
                problems.append(f"{key} is twice in history")
            elif record.content != sent_as.request.content:
                problems.append(f"{key} is in history with other content")
            seen.add(key)
        if len(seen) != len(sent):
            problems.append(
                f"{tenant}/{conversation}: {len(sent) - len(seen)} sent keys not in history"
            )
    if len(problems) > MAX_PROBLEMS:
        problems = [*problems[:MAX_PROBLEMS], f"... and {len(problems) - MAX_PROBLEMS} more"]
    return problems


@dataclass
class Fault:
    """One fault of a test, with what it caught in flight."""

    what: str
    in_flight: int
    """Commit calls outstanding in the clients at the instant of the fault."""
    abandoned: int
    """Of those, keys whose clients gave up (left to recovery)."""
    unfinished_after: int = 0
    """Intents not COMMITTED right after the fault (direct backend scan)."""
    left_to_recovery: int = 0
    """Of those, the abandoned keys': only recovery finishes them."""
    down_s: float = 0.0
    """From the fault until the service answered SERVING again."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds of each step of the fault (to NOT_SERVING, restart, to SERVING...)."""


async def observe(
    what: str, in_flight: int, abandoned: set[CommitKey], open_backend: OpenBackend
) -> Fault:
    """A fault's record, with a direct scan of what it left unfinished (run it once the
    backend answers again)."""
    left = await unfinished(open_backend)
    return Fault(
        what,
        in_flight,
        len(abandoned),
        unfinished_after=len(left),
        left_to_recovery=sum(1 for intent in left if intent.key in abandoned),
    )


@dataclass
class Report:
    """What a test measured; printed as one JSON line."""

    test: str
    faults: list[Fault] = field(default_factory=list)
    unfinished_before_recovery: int = 0
    recovered: int = 0
    load: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def finish(self, driver: LoadDriver, problems: list[str]) -> None:
        self.load = driver.summary()
        self.problems = problems

    def print(self) -> None:
        print(f"\nFAULT REPORT {json.dumps(asdict(self), sort_keys=True)}")


async def wait_all_committed(open_backend: OpenBackend, timeout_s: float) -> float:
    """Poll the direct scan until no intent is left unfinished; returns the seconds waited."""
    began = time.monotonic()
    left: list[RecoveryItem] = []
    while time.monotonic() - began < timeout_s:
        left = await unfinished(open_backend)
        if not left:
            return time.monotonic() - began
        await asyncio.sleep(0.2)
    raise AssertionError(f"{len(left)} intents still unfinished after {timeout_s:.0f}s")
