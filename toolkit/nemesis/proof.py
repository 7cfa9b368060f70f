"""Proof that a fault took effect: what was observed, judged by pure rules.

A fault that began proves nothing until its effect is seen, so right after each
fault begins the nemesis observes it and records the evidence in the history
(``fault`` lines with phase ``proven`` or ``no-effect``):

* a toxic: a probe request sent through the node's proxy (``Probe``: a Redis PING,
  a CQL OPTIONS frame) and the proxy's byte counters (Toxiproxy's
  ``/metrics``: bytes received and sent on, per direction). ``latency`` answers no
  sooner than the delay; an upstream ``timeout`` swallows the request (received,
  never sent on); a downstream ``timeout`` delivers the request and swallows the
  reply (the request ran, its reply is lost); ``reset-peer`` ends the connection with
  no reply (downstream: after the request was sent on);
* a SIGSTOP: the process is in state ``T`` (``/proc/PID/stat``); a SIGKILL: the
  process is gone, and at the fault's end its restart answers (a node its probe, a
  replica its health check);
* a clock fault: the faked clock read by a probe run under the same ``faketime``
  setting is off by the offset, and the replica itself reports it where the service
  measures skew (the Redis backend's clock warning; Scylla's refusal beyond its guard).

``verdict`` turns one schedule's figures into the lines that fail a run.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REDIS_PING = b"PING\r\n"
CQL_OPTIONS = b"\x04\x00\x00\x01\x05\x00\x00\x00\x00"
"""A CQL v4 OPTIONS frame (stream 1): the node answers SUPPORTED."""
QUIET_S = 1.0
"""How long a probe waits for a reply that a swallowing toxic must keep away."""
STATE_WAIT_S = 2.0
COUNTER_SETTLE_S = 2.0
"""Toxiproxy adds a connection's bytes to its counters only when that direction's copy
ends, a moment after the probe closed its socket: a toxic's proof reads them again
until they show the probe's connection, for at most this long."""
DISRUPTIVE = frozenset(
    {"kill-node", "pause-node", "kill-master", "pause-master", "kill-replica", "pause-replica"}
)
"""Fault kinds after which some call must have ended with an unknown outcome."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe request through a proxy got: the reply's bytes (empty when
    none), how long it took, and how it failed (``timeout``, ``reset``, ``closed``)."""

    reply: bytes
    elapsed_s: float
    failure: str = ""


@dataclass(frozen=True, slots=True)
class Counters:
    """A proxy's byte counters: received from the source and sent on, per direction
    (upstream: replica to node)."""

    up_received: int = 0
    up_sent: int = 0
    down_received: int = 0
    down_sent: int = 0

    def minus(self, earlier: Counters) -> Counters:
        return Counters(
            self.up_received - earlier.up_received,
            self.up_sent - earlier.up_sent,
            self.down_received - earlier.down_received,
            self.down_sent - earlier.down_sent,
        )


@dataclass(frozen=True, slots=True)
class Proof:
    """Whether a fault's effect was seen, and what was seen (for the history)."""

    ok: bool
    evidence: str


@dataclass(frozen=True, slots=True)
class ToxicSpec:
    """A toxic as the nemesis adds it: kind, direction and, for latency, the delay."""

    kind: str  # latency | timeout | reset_peer
    stream: str  # upstream | downstream
    latency_ms: int = 0
    jitter_ms: int = 0


def probe(address: str, request: bytes, wait_s: float) -> ProbeResult:
    """Send ``request`` to ``address`` on a new connection; wait ``wait_s`` for a reply."""
    host, _, port = address.rpartition(":")
    began = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=2.0) as sock:
            sock.settimeout(wait_s)
            sock.sendall(request)
            reply = sock.recv(4096)
    except TimeoutError:
        return ProbeResult(b"", time.monotonic() - began, "timeout")
    except ConnectionResetError:
        return ProbeResult(b"", time.monotonic() - began, "reset")
    except OSError as exc:
        return ProbeResult(b"", time.monotonic() - began, type(exc).__name__)
    elapsed = time.monotonic() - began
    return ProbeResult(reply, elapsed, "" if reply else "closed")


def judge_partition(through_proxy: ProbeResult, direct: ProbeResult) -> Proof:
    """A node cut off from its peers: a connection to its broadcast address (the only
    address its peers reach it at) is refused, while its storage port itself still
    accepts one (the process runs: a network fault, not a kill). An empty probe
    waits ``QUIET_S`` for nothing, so an accepted connection shows as ``timeout``."""
    cut = through_proxy.failure == "ConnectionRefusedError"
    alive = direct.failure in ("", "timeout", "closed")
    seen = f"peers' way in: {through_proxy.failure or 'answered'}; the node's own port: " + (
        direct.failure or "answered"
    )
    return Proof(cut and alive, f"{seen}; refused there, accepted here")


def judge_toxic(spec: ToxicSpec, result: ProbeResult, delta: Counters, sent: int) -> Proof:
    """Whether ``result`` (a probe of ``sent`` bytes) and the proxy's counter ``delta``
    over the probe show ``spec``'s effect."""
    seen = (
        f"probe {result.failure or f'{len(result.reply)} B reply'} after"
        f" {result.elapsed_s * 1000:.0f} ms; upstream {delta.up_received}/{delta.up_sent} B,"
        f" downstream {delta.down_received}/{delta.down_sent} B (received/sent on)"
    )
    if spec.kind == "latency":
        floor_s = max(0, spec.latency_ms - spec.jitter_ms) / 1000 * 0.9
        ok = bool(result.reply) and result.elapsed_s >= floor_s
        return Proof(ok, f"{seen}; a reply no sooner than {floor_s * 1000:.0f} ms")
    reached = delta.up_sent >= sent  # the request was sent on to the node
    if spec.kind == "timeout" and spec.stream == "upstream":
        held = delta.up_received - delta.up_sent >= sent
        ok = result.failure == "timeout" and held
        return Proof(ok, f"{seen}; the request swallowed, no reply")
    if spec.kind == "timeout":
        held = delta.down_received > delta.down_sent
        ok = result.failure == "timeout" and reached and held
        return Proof(ok, f"{seen}; the request ran, its reply swallowed")
    if spec.kind == "reset_peer":
        cut = result.failure in ("reset", "closed") and not result.reply
        ok = cut and (reached or spec.stream == "upstream")
        where = "after the request ran" if spec.stream == "downstream" else "before the node"
        return Proof(ok, f"{seen}; the connection reset {where}")
    return Proof(False, f"no rule for toxic {spec.kind}")


def settled_toxic_proof(
    spec: ToxicSpec,
    result: ProbeResult,
    before: Counters,
    read: Callable[[], Counters],
    sent: int,
    settle_s: float = COUNTER_SETTLE_S,
) -> Proof:
    """``judge_toxic`` over the counters read again until they show the probe's
    effect or ``settle_s`` passes: a single read races Toxiproxy's own accounting."""
    deadline = time.monotonic() + settle_s
    while True:
        found = judge_toxic(spec, result, read().minus(before), sent)
        if found.ok or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def process_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` ('' when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""
    return text.rpartition(")")[2].split()[0] if ")" in text else ""


def wait_state(pid: int, wanted: Iterable[str], wait_s: float = STATE_WAIT_S) -> str:
    """Poll ``pid``'s state until it is one of ``wanted`` ('' = gone) or ``wait_s``."""
    allowed = set(wanted)
    deadline = time.monotonic() + wait_s
    state = process_state(pid)
    while state not in allowed and time.monotonic() < deadline:
        time.sleep(0.02)
        state = process_state(pid)
    return state


def judge_pause(pid: int | None, state: str) -> Proof:
    ok = pid is not None and state in ("T", "t")
    return Proof(ok, f"pid {pid} in state {state or 'gone'} (stopped: T)")


def judge_kill(pid: int | None, state: str) -> Proof:
    ok = pid is not None and state in ("", "Z", "X")
    return Proof(ok, f"pid {pid} {'gone' if not state else f'in state {state}'} after SIGKILL")


CLOCK_PROBE = (
    "import sys, time; print('ready', flush=True); sys.stdin.readline();"
    " print(time.time(), flush=True); sys.stdin.read()"
)
"""Says it runs, reads its clock when asked (a line on stdin), prints it, then waits
to be ended."""


def faked_clock_offset_s(env: Mapping[str, str], python: str) -> float:
    """How far a process started with ``env`` (a faketime setting) reads the wall
    clock from this one's: a tiny probe run under the same setting, asked for its
    clock once it runs and read against the middle of that request and its answer
    (not against its exit, which under load can come long after its reading)."""
    import subprocess

    with subprocess.Popen(
        [python, "-c", CLOCK_PROBE],
        env={**os.environ, **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdout.readline()  # it runs: its start-up is outside the bracket
            before = time.time()
            child.stdin.write("\n")
            child.stdin.flush()
            line = child.stdout.readline()
            after = time.time()
        finally:
            child.kill()
            child.wait(timeout=20)
    if not line.strip():
        raise RuntimeError("the clock probe printed no time")
    return float(line) - (before + after) / 2


def judge_clock(
    wanted_s: float, probed_s: float, reported: str | None, report_expected: bool
) -> Proof:
    """A clock fault is proven when the probe under its faketime setting is off by
    the offset (within 0.5 s) and, where the service measures skew, it reported it."""
    close = abs(probed_s - wanted_s) <= 0.5
    told = reported is not None or not report_expected
    text = f"faketime probe {probed_s:+.2f}s (wanted {wanted_s:+.2f}s)"
    if reported is not None:
        text += f"; the process reported: {reported}"
    elif report_expected:
        text += "; the process reported no skew"
    return Proof(close and told, text)


@dataclass(slots=True)
class ScheduleFigures:
    """What one schedule did, for ``verdict``."""

    acks: int
    unknown_answers: int
    """Calls or attempts that ended with an unknown-outcome status."""
    min_acks: int
    fired: Mapping[str, int] = field(default_factory=dict)
    unproven: Mapping[str, int] = field(default_factory=dict)


def verdict(figures: ScheduleFigures) -> list[str]:
    """The ``FAILED:`` lines of one schedule (empty: nothing fails it)."""
    lines = []
    if figures.unproven:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(figures.unproven.items()))
        lines.append(f"FAILED: faults without effect: {sum(figures.unproven.values())} ({kinds})")
    if figures.acks < figures.min_acks:
        lines.append(f"FAILED: ACKs {figures.acks} under the floor --min-acks {figures.min_acks}")
    disruptive = sorted(k for k, n in figures.fired.items() if n > 0 and k in DISRUPTIVE)
    if disruptive and figures.unknown_answers == 0:
        lines.append(
            f"FAILED: no unknown outcome although {', '.join(disruptive)} fired"
            " (a kill or pause that no call noticed proves nothing)"
        )
    return lines


def default_min_acks(duration_s: float, quorum_lost_s: float = 0.0) -> int:
    """One ACK per second of the schedule in which the storage had a majority of
    its nodes up, at least 10: far under any healthy run (the slowest, the CQL
    cluster on two shared cores, ACKs about 6 a second). While a majority is down
    (two of three CQL nodes, the one Redis) every commit is rightly refused, so
    those seconds owe no ACK; a 60 s schedule with two CQL nodes down for 50 s of
    it (restarts included) owes 10, not 60."""
    return max(10, int(duration_s - quorum_lost_s))


def quorum_lost_seconds(
    outages: Sequence[tuple[int, float, float]], node_count: int, start: float, end: float
) -> float:
    """Seconds of [start, end] during which at least a majority of ``node_count``
    nodes were down. ``outages``: (node, down from, up again) per kill or pause, the
    end being when the restarted node answered (not when the fault's slot ended)."""
    majority = node_count // 2 + 1
    edges: list[tuple[float, int, int]] = []
    for node, down, up in outages:
        down, up = max(down, start), min(up, end)
        if up > down:
            edges += [(down, 1, node), (up, -1, node)]
    lost = 0.0
    down_count: Counter[int] = Counter()
    since = start
    for at, step, node in sorted(edges, key=lambda e: (e[0], -e[1])):
        if sum(1 for n in down_count.values() if n > 0) >= majority:
            lost += at - since
        down_count[node] += step
        since = at
    return lost


def overrun_s(duration_s: float, restarting_s: float, minimum_s: float) -> float:
    """How long a schedule's faults may go on past ``duration_s``: one fault waits
    for the one before it, so each restart in it can push the later ones back;
    ``restarting_s`` is what its restarts may take together (a CQL node on a shared
    box takes one to two minutes, a service process opening the CQL cluster up to
    two at load 30)."""
    return max(duration_s, minimum_s, restarting_s)
