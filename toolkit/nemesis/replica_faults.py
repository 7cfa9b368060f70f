"""Faults of the ``serve`` replicas, and the proof of each.

* ``kill-replica``: SIGKILL; proven when the process is gone, and at the fault's end
  when its restart answers the health check (SERVING).
* ``pause-replica``: SIGSTOP for the fault's length (longer than the workload's 4 s
  attempt timeout when the schedule allows); proven when the process is in state T.
* ``clock-offset``: the replica restarted under ``faketime`` (``LD_PRELOAD`` of
  libfaketime, ``FAKETIME=+Ns``; the monotonic clock is left alone), so its wall
  clock, and with it everything it timestamps, is really off. Offsets are drawn from
  ``CLOCK_OFFSETS_S``, inside and beyond the Scylla backend's 3 s guard
  (``MC_SCYLLA_MAX_CLOCK_SKEW``). Proven when a probe run under the same setting reads
  the offset and the replica reports the skew where the service measures it: the
  Redis backend's clock warning (every offset over 1 s: it then takes time from
  Redis), Scylla's refusal to serve beyond the guard (the expected effect: the replica
  exits at start-up, and clients get UNAVAILABLE, an unknown outcome).
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from service.client import NO_RETRY, CommitClient
from toolkit.nemesis import proof
from toolkit.nemesis.proof import Proof
from toolkit.nemesis.replicas import Replica

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
CLOCK_OFFSETS_S = (-2.5, 2.0, -8.0, 20.0, 3600.0)
"""Inside (|x| < 3 s) and beyond the Scylla guard; an hour ahead, too."""
SCYLLA_GUARD_S = 3.0
REDIS_WARN_S = 1.0
"""``service/backend_clock.py`` warns of an offset over this (WARN_OFFSET_MS)."""
START_RETRY_S = 60.0
"""A replica that cannot start (its storage down in an overlapping fault) is tried again
for at least this long (and for as long as a storage node's restart may take)."""
RESTART_READY_S = 45.0
"""How long a restarted replica may take to answer its health check SERVING."""
_REDIS_SKEW = re.compile(r"this replica's clock is ([+-][0-9.]+)s off the backend's")
_SCYLLA_REFUSAL = re.compile(r"this replica's clock is [0-9.]+s (?:behind|ahead of) the cluster")
KINDS = ("kill-replica", "pause-replica", "clock-offset")


def faketime_library() -> str | None:
    return next((lib for lib in FAKETIME_LIBS if Path(lib).is_file()), None)


def faketime_env(offset_s: float, library: str) -> dict[str, str]:
    return {
        "LD_PRELOAD": library,
        "FAKETIME": f"{offset_s:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def clock_offset(seed: int, at_s: float, target: int) -> float:
    """The offset of one clock fault: from the schedule's seed, so a replay repeats it."""
    return random.Random(f"{seed}:{at_s}:{target}").choice(CLOCK_OFFSETS_S)


def refuses_for(backend: str, offset_s: float) -> bool:
    """Whether a service process must refuse to start with this skew (Scylla's guard)."""
    return backend == "scylla" and abs(offset_s) > SCYLLA_GUARD_S + 0.5


def refused_for_clock(log: str) -> bool:
    """Whether a process's log says it refused to serve for its clock (Scylla's guard)."""
    return _SCYLLA_REFUSAL.search(log) is not None


def prove_clock(
    backend: str, library: str, wanted: float, log: Callable[[], str], refused: bool
) -> Proof:
    """A clock fault on a service process (a serve replica or a relay), whose log since
    its restart ``log`` returns: a probe under the same faketime setting reads the
    offset, and the process reported the skew where the service measures it (Redis:
    its clock warning, over 1 s; Scylla beyond the guard: its refusal to start)."""
    probed = proof.faked_clock_offset_s(faketime_env(wanted, library), sys.executable)
    expected = backend == "redis" and abs(wanted) > REDIS_WARN_S + 0.2
    reported: str | None = None
    if refuses_for(backend, wanted):
        expected = True
        found = _SCYLLA_REFUSAL.search(log())
        reported = f"refused to serve ({found.group(0)})" if refused and found else None
    elif expected:  # the clock loop measures it again every readiness interval
        deadline = time.monotonic() + 5.0
        while reported is None and time.monotonic() < deadline:
            match = _REDIS_SKEW.search(log())
            if match and abs(float(match.group(1)) - wanted) <= 1.0:
                reported = f"clock {match.group(1)}s off the backend's"
            else:
                time.sleep(0.5)
    return proof.judge_clock(wanted, probed, reported, expected)


class Service(Protocol):
    """A serve replica or a relay process: started, and its log read."""

    def start(self) -> None: ...
    def log_size(self) -> int: ...
    def log_since(self, offset: int) -> str: ...


def start_service(process: Service, retry_s: float, expect_refusal: bool = False) -> bool:
    """Start ``process``, retrying for ``retry_s`` while its storage is down (an
    overlapping storage fault); False when it refused to serve for its clock (the
    expected effect beyond the guard)."""
    deadline = time.monotonic() + retry_s
    while True:
        at = process.log_size()
        try:
            process.start()
            return True
        except RuntimeError:
            if refused_for_clock(process.log_since(at)):
                return False
            if expect_refusal or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


class ReplicaFaults:
    """Begins, ends and proves the replica faults of one nemesis."""

    def __init__(
        self, replicas: list[Replica], backend: str, *, storage_restart_s: float = 0.0
    ) -> None:
        self.replicas = replicas
        self.backend = backend
        # a replica restarted while storage nodes are down (an overlapping kill-node)
        # waits for them: as long as a node's restart may take, and a margin
        self.start_retry_s = max(START_RETRY_S, storage_restart_s + 90.0)
        self.library = faketime_library()
        self._pids: dict[tuple[str, int], int | None] = {}
        self._clock: dict[int, tuple[float, int, bool]] = {}
        """target: (offset wanted, log offset at the restart, refused to serve)."""

    def begin(self, kind: str, target: int, offset_s: float = 0.0) -> None:
        replica = self.replicas[target]
        self._pids[(kind, target)] = replica.pid
        if kind == "kill-replica":
            replica.kill()
        elif kind == "pause-replica":
            replica.pause()
        elif kind == "clock-offset":
            assert self.library is not None
            at = replica.log_size()
            replica.stop()
            replica.extra_env = faketime_env(offset_s, self.library)
            refused = not self._start(replica, expect_refusal=self.refuses(offset_s))
            self._clock[target] = (offset_s, at, refused)
        else:
            raise ValueError(f"unknown replica fault {kind}")

    def refuses(self, offset_s: float) -> bool:
        """Whether the service must refuse to serve with this skew (Scylla's guard)."""
        return refuses_for(self.backend, offset_s)

    def _start(self, replica: Replica, expect_refusal: bool = False) -> bool:
        return start_service(replica, self.start_retry_s, expect_refusal)

    def end(self, kind: str, target: int) -> None:
        replica = self.replicas[target]
        if kind == "kill-replica":
            self._start(replica)
        elif kind == "pause-replica":
            replica.resume()
        elif kind == "clock-offset":
            replica.stop()
            replica.extra_env = {}
            self._start(replica)

    def prove_begin(self, kind: str, target: int) -> Proof:
        pid = self._pids.get((kind, target))
        if kind == "kill-replica":
            return proof.judge_kill(pid, proof.wait_state(pid, ("", "Z", "X")) if pid else "?")
        if kind == "pause-replica":
            return proof.judge_pause(pid, proof.wait_state(pid, ("T", "t")) if pid else "?")
        return self._prove_clock(target)

    def _prove_clock(self, target: int) -> Proof:
        wanted, at, refused = self._clock[target]
        assert self.library is not None
        replica = self.replicas[target]
        return prove_clock(self.backend, self.library, wanted, lambda: replica.log_since(at),
                           refused)  # fmt: skip

    async def prove_end(self, kind: str, target: int) -> Proof | None:
        """After a kill: the restarted replica answers its health check SERVING within
        ``RESTART_READY_S`` (it opens its backend first: on the CQL cluster a driver
        session, its statements and the clock-skew samples, slow on a loaded box)."""
        if kind != "kill-replica":
            return None
        replica = self.replicas[target]
        state = "not answering"
        deadline = time.monotonic() + RESTART_READY_S
        async with CommitClient.connect(replica.target, retry=NO_RETRY) as client:
            while time.monotonic() < deadline:
                try:
                    state = await client.health()
                except Exception as exc:
                    state = type(exc).__name__
                if state == "SERVING":
                    break
                await asyncio.sleep(0.5)
        return Proof(state == "SERVING", f"restarted as pid {replica.pid}: health {state}")
