"""The nemesis's proof rules: a fault counts only when its effect was observed, and a
schedule fails on faults without effect, too few ACKs, or kills and pauses that no
call noticed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.nemesis import proof
from toolkit.nemesis.proof import Counters, ProbeResult, ScheduleFigures, ToxicSpec

PING = len(proof.REDIS_PING)
REPLY = ProbeResult(b"+PONG\r\n", 0.001)
SILENT = ProbeResult(b"", 1.0, "timeout")
SLOW = ProbeResult(b"+PONG\r\n", 0.2)
RESET = ProbeResult(b"", 0.001, "reset")
NOTHING = Counters()
SWALLOWED_UP = Counters(up_received=PING)
SWALLOWED_DOWN = Counters(PING, PING, 7, 0)
SENT_ON = Counters(PING, PING, 7, 7)


@pytest.mark.parametrize(
    ("spec", "result", "delta", "ok"),
    [
        (
            ToxicSpec("latency", "downstream", 250, 150),
            ProbeResult(b"+PONG\r\n", 0.2),
            SENT_ON,
            True,
        ),
        (ToxicSpec("latency", "downstream", 250, 150), REPLY, SENT_ON, False),  # too fast
        (ToxicSpec("latency", "downstream", 6000), SILENT, SWALLOWED_DOWN, False),  # no reply
        (ToxicSpec("timeout", "upstream"), SILENT, SWALLOWED_UP, True),
        (ToxicSpec("timeout", "upstream"), REPLY, SENT_ON, False),  # the toxic did nothing
        (ToxicSpec("timeout", "upstream"), SILENT, NOTHING, False),  # nothing held back
        (ToxicSpec("timeout", "downstream"), SILENT, SWALLOWED_DOWN, True),
        (ToxicSpec("timeout", "downstream"), SILENT, SWALLOWED_UP, False),  # request never ran
        (ToxicSpec("reset_peer", "upstream"), RESET, SWALLOWED_UP, True),
        (ToxicSpec("reset_peer", "upstream"), REPLY, SENT_ON, False),
        (ToxicSpec("reset_peer", "downstream"), RESET, Counters(PING, PING), True),
        (ToxicSpec("reset_peer", "downstream"), RESET, SWALLOWED_UP, False),  # not sent on
    ],
)
def test_a_toxic_is_proven_only_by_its_own_effect(
    spec: ToxicSpec, result: ProbeResult, delta: Counters, ok: bool
) -> None:
    found = proof.judge_toxic(spec, result, delta, PING)
    assert found.ok is ok, found.evidence
    assert "probe" in found.evidence


def test_a_stopped_process_is_in_state_t_and_a_killed_one_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not proof.judge_pause(child.pid, proof.process_state(child.pid)).ok
        child.send_signal(signal.SIGSTOP)
        stopped = proof.wait_state(child.pid, ("T", "t"))
        assert proof.judge_pause(child.pid, stopped).ok
        assert not proof.judge_kill(child.pid, stopped).ok
        child.kill()
        child.wait()
        gone = proof.wait_state(child.pid, ("",))
        assert proof.judge_kill(child.pid, gone).ok
        assert not proof.judge_pause(child.pid, gone).ok
    finally:
        child.kill()
        child.wait()


def test_a_clock_fault_needs_the_probe_and_the_replicas_own_report() -> None:
    assert proof.judge_clock(8.0, 8.1, "clock +8.000s off the backend's", True).ok
    assert not proof.judge_clock(8.0, 0.0, "clock +8.000s off the backend's", True).ok
    assert not proof.judge_clock(8.0, 8.0, None, True).ok  # the replica saw nothing
    assert proof.judge_clock(-2.5, -2.4, None, False).ok  # inside the guard: nothing reports


def test_a_faketime_probe_reads_the_offset() -> None:
    library = next((lib for lib in proof_libs() if lib), None)
    # scripts/setup.sh installs faketime: without it the nemesis has no clock fault
    assert library is not None, "libfaketime is not installed: run scripts/setup.sh"
    env = {"LD_PRELOAD": library, "FAKETIME": "+30", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    assert abs(proof.faked_clock_offset_s(env, sys.executable) - 30.0) < 0.5


def proof_libs() -> list[str | None]:
    from toolkit.nemesis.replica_faults import faketime_library

    return [faketime_library()]


def test_the_verdict_fails_unproven_faults_too_few_acks_and_unnoticed_kills() -> None:
    clean = ScheduleFigures(acks=500, unknown_answers=3, min_acks=18, fired={"kill-node": 1})
    assert proof.verdict(clean) == []
    unproven = ScheduleFigures(500, 3, 18, {"timeout": 2}, {"timeout": 1})
    assert proof.verdict(unproven) == ["FAILED: faults without effect: 1 (timeout x1)"]
    starved = ScheduleFigures(17, 3, 18, {"latency": 1})
    assert proof.verdict(starved) == ["FAILED: ACKs 17 under the floor --min-acks 18"]
    unnoticed = ScheduleFigures(500, 0, 18, {"pause-node": 1, "kill-replica": 1, "latency": 1})
    (line,) = proof.verdict(unnoticed)
    assert line.startswith("FAILED: no unknown outcome although kill-replica, pause-node fired")
    quiet = ScheduleFigures(500, 0, 18, {"latency": 1})  # no kill or pause: nothing required
    assert proof.verdict(quiet) == []
    assert proof.default_min_acks(60) == 60 and proof.default_min_acks(5) == 10


class _LateCounters:
    """Toxiproxy's /metrics as it behaves: a connection's bytes are added when that
    direction's copy ends, a moment after the probe closed its socket, so the first
    read after the probe can still show the figures from before it."""

    def __init__(self, *reads: dict[str, int]) -> None:
        self.reads = list(reads)

    def byte_counters(self, proxy: str) -> dict[str, int]:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


@pytest.mark.parametrize(
    ("kind", "final"),
    [
        ("timeout", {"upstream received": PING}),
        (
            "timeout-reply",
            {"upstream received": PING, "upstream sent": PING, "downstream received": 7},
        ),
        ("reset-reply", {"upstream received": PING, "upstream sent": PING}),
    ],
)
def test_a_toxic_proof_reads_the_counters_until_the_probes_connection_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, final: dict[str, int]
) -> None:
    from toolkit.nemesis import topology

    late = _LateCounters({}, {}, final)  # before the probe, just after it, settled
    top = topology.Topology(tmp_path, late)  # type: ignore[arg-type]
    top.probe_request = proof.REDIS_PING
    top.proxies, top.listen = ["redis-0"], ["127.0.0.1:1"]
    failure = SILENT if kind.startswith("timeout") else RESET
    monkeypatch.setattr(proof, "probe", lambda address, request, wait_s: failure)
    found = top._prove_toxic(topology.TOXICS[kind], 0)
    assert found.ok, found.evidence
    assert late.reads == [final]  # it read again until the probe's bytes were counted


def test_a_faketime_probe_is_read_when_it_reads_the_clock_not_when_it_exits(
    tmp_path: Path,
) -> None:
    """Under load a probe can take long to exit after it printed its clock; the old
    probe compared its reading with the time after its exit (0.48 s late in one
    loaded smoke run, against a 0.5 s tolerance). This probe never exits by itself:
    the reading must be taken from its output, and the probe ended."""
    slow = tmp_path / "python-slow-exit"
    slow.write_text(f'#!/bin/sh\n"{sys.executable}" "$@" && exec sleep 60\n', encoding="ascii")
    slow.chmod(0o755)
    offset = proof.faked_clock_offset_s({}, str(slow))  # no faketime: the real clock
    assert abs(offset) < 0.5


REFUSED = ProbeResult(b"", 0.001, "ConnectionRefusedError")


@pytest.mark.parametrize(
    ("through_proxy", "direct", "ok"),
    [
        (REFUSED, SILENT, True),  # cut off from its peers, the node itself running
        (SILENT, SILENT, False),  # the peers' way in still accepts: no partition
        (REFUSED, REFUSED, False),  # the node is down: a kill, not a partition
    ],
)
def test_a_partition_is_the_peers_way_in_refused_while_the_node_runs(
    through_proxy: ProbeResult, direct: ProbeResult, ok: bool
) -> None:
    assert proof.judge_partition(through_proxy, direct).ok is ok
