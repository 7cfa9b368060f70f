"""The client campaign's process mode (issue 22's campaign): a few seeds with real
device processes on memory and on Redis, and the checker shown to catch what it
claims to catch, so a run cannot pass trivially."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.domain.model import MessageContent, MessageRecord, MessageType
from toolkit.client_campaign import cli
from toolkit.client_campaign.proc_check import Ledger, SendAttempt, check
from toolkit.client_campaign.proc_scenario import Options, run_proc_seed

CLEAN = "lost: 0  duplicated: 0  wrongly confirmed: 0  wrong refusal: 0  stuck: 0  phantom: 0"


@pytest.mark.e2e
def test_process_mode_on_memory_loses_and_confirms_nothing_wrongly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["--processes", "--seeds", "2", "--first-seed", "7", "--steps", "16"])
    out = capsys.readouterr().out
    assert CLEAN in out, out
    assert "unsettled seeds: 0  broken seeds: 0" in out, out
    assert "device processes" in out, out
    assert code == 0, out


@pytest.mark.e2e
@pytest.mark.redis
def test_process_mode_on_redis_loses_and_confirms_nothing_wrongly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--processes", "--backend", "redis", "--seeds", "1", "--first-seed", "3"]
    code = cli.main([*argv, "--steps", "14"])
    out = capsys.readouterr().out
    assert CLEAN in out, out
    assert "backend: redis" in out and "device processes" in out, out
    assert code == 0, out


# --- the checker on made-up outcomes (pure logic) --------------------------------------


@dataclass
class FakeDevice:
    user: str
    device: str
    events: list[dict[str, Any]] = field(default_factory=list)


def _record(cmid: str, device: str, size: int, seq: int = 1) -> MessageRecord:
    return MessageRecord(
        tenant="acme",
        conversation="c0",
        seq=seq,
        message_id=f"m-{seq}",
        sender="u0",
        device=device,
        cmid=cmid,
        content=MessageContent(MessageType.TEXT, b"x" * size),
        mentions=(),
        reply_to="",
        server_ts_ms=1_000,
    )


def _confirmed(cmid: str, seq: int) -> dict[str, Any]:
    return {
        "ev": "confirmed",
        "cmid": cmid,
        "conversation": "c0",
        "message_id": f"m-{seq}",
        "seq": seq,
        "via": "ack",
    }


def _run(
    attempts: list[SendAttempt], records: list[MessageRecord], a: FakeDevice, b: FakeDevice
) -> Any:
    ledger = Ledger(initial={"c0": {"u0"}})
    for attempt in attempts:
        attempt.reply = {"ev": "persisted"}
        ledger.record(attempt, 0.0)
    held = {"held": {"c0": [r.message_id for r in records]}, "pending": [], "parked": []}
    statuses = {("u0", "a"): held, ("u0", "b"): held}
    return check(ledger, {"c0": records}, [a, b], statuses)


def test_a_device_confirming_the_other_devices_send_is_wrongly_confirmed() -> None:
    attempts = [
        SendAttempt("u0", "a", "k", "c0", 10, "conflict"),
        SendAttempt("u0", "b", "k", "c0", 11, "conflict"),
    ]
    a = FakeDevice("u0", "a", [_confirmed("k", 1)])
    b = FakeDevice("u0", "b", [_confirmed("k", 1)])  # b's own send was the refused one
    verdict = _run(attempts, [_record("k", "a", 10)], a, b)
    assert verdict.wrongly_confirmed == 1, verdict.problems
    assert not verdict.ok


def test_a_confirmation_with_other_coordinates_is_wrongly_confirmed() -> None:
    a = FakeDevice("u0", "a", [_confirmed("k", 2)])  # the server holds it as seq 1
    verdict = _run(
        [SendAttempt("u0", "a", "k", "c0", 10, "normal")],
        [_record("k", "a", 10)],
        a,
        FakeDevice("u0", "b"),
    )
    assert verdict.wrongly_confirmed == 1, verdict.problems


def test_the_right_outcomes_pass_and_a_missing_send_is_lost() -> None:
    attempts = [
        SendAttempt("u0", "a", "k", "c0", 10, "conflict"),
        SendAttempt("u0", "b", "k", "c0", 11, "conflict"),
    ]
    a = FakeDevice("u0", "a", [_confirmed("k", 1)])
    b = FakeDevice("u0", "b", [{"ev": "failed", "cmid": "k", "error": "IdempotencyConflict"}])
    assert _run(attempts, [_record("k", "a", 10)], a, b).ok
    gone = _run([SendAttempt("u0", "a", "j", "c0", 5, "normal")], [], FakeDevice("u0", "a"), b)
    assert gone.lost == 1, gone.problems


def test_a_refusal_with_the_wrong_code_is_caught() -> None:
    a = FakeDevice("u0", "a", [{"ev": "failed", "cmid": "k", "error": "NotAMember"}])
    verdict = _run([SendAttempt("u0", "a", "k", "c0", 10, "normal")], [], a, FakeDevice("u0", "b"))
    assert verdict.wrong_refusal == 1, verdict.problems


def _added(*ids: str) -> dict[str, Any]:
    return {"ev": "added", "ids": list(ids)}


def test_a_message_reported_twice_in_one_store_life_is_duplicated() -> None:
    b = FakeDevice("u0", "b", [{"ev": "started"}, {"ev": "ready"}, _added("m-1")])
    b.events += [{"ev": "started"}, {"ev": "ready"}, _added("m-1")]  # a kill is no new life
    verdict = _run([], [_record("k", "a", 10)], FakeDevice("u0", "a"), b)
    assert verdict.duplicated == 1, verdict.problems


def test_a_reset_whose_process_died_opening_the_damaged_file_starts_a_new_life() -> None:
    b = FakeDevice("u0", "b", [{"ev": "started"}, {"ev": "ready"}, _added("m-1")])
    b.events += [{"ev": "corrupted"}, {"ev": "started"}]  # killed before it said anything
    b.events += [{"ev": "started"}, {"ev": "ready"}, _added("m-1")]
    assert _run([], [_record("k", "a", 10)], FakeDevice("u0", "a"), b).ok


def test_a_loss_is_reported_only_by_a_reset_after_the_send() -> None:
    lost_reset = {"ev": "reset", "kept": 0, "lost": True}
    before = FakeDevice("u0", "a", [lost_reset])
    late = SendAttempt("u0", "a", "j", "c0", 5, "normal", at=1)  # asked for after the reset
    assert _run([late], [], before, FakeDevice("u0", "b")).lost == 1
    early = SendAttempt("u0", "a", "j", "c0", 5, "normal", at=0)
    verdict = _run([early], [], before, FakeDevice("u0", "b"))
    assert (verdict.lost, verdict.reported_lost) == (0, 1), verdict.problems


SCRIPT = (*("send",) * 8, "outlive", "server", "send", "send")
"""Sends, a device kept down past its small mailbox's trim, then a server kill
(the seeded draws of the random smoke above vary with timing; a script does not)."""


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_device_kept_down_past_a_small_mailbox_dies_mid_rebuild_and_recovers(
    backend: str, tmp_path: Path
) -> None:
    options = Options(backend=backend, script=SCRIPT, small=True)
    verdict = await run_proc_seed(11, options, tmp_path)
    assert not verdict.problems, verdict.problems
    assert verdict.fired.get("server kill") == 1, verdict.fired
    assert verdict.fired.get("outlive: cursor expired while down") == 1, verdict.fired
    assert verdict.fired.get("kill at C-CLIENT-07") == 1, verdict.fired  # died mid-REBUILD
    assert verdict.fired.get("rebuild", 0) >= 1, verdict.fired  # the next process finished it
    assert verdict.settled_in_s >= 0
