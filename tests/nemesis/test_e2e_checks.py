"""The e2e nemesis's checkers over hand-written histories: each rule has a history
that must fail it and one that must pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from service.domain.model import MessageContent, MessageRecord, MessageType
from toolkit.client_campaign.proc_check import Ledger, SendAttempt
from toolkit.nemesis.e2e import delivery, lanes
from toolkit.nemesis.e2e.lanes import LaneRead
from toolkit.nemesis.sabotage import DELIVERY_MODES

LANE = "inbox:u0"


def read(cursor: tuple[int, int], entries: list[tuple[int, str]], nxt: tuple[int, int],
         withheld: tuple[int, ...] = ()) -> LaneRead:  # fmt: skip
    return LaneRead(LANE, *cursor, tuple(entries), withheld, *nxt)


GOOD = [
    read((0, 0), [(1, "m1"), (2, "m2")], (1, 2)),
    read((1, 2), [(3, "m3")], (1, 4), withheld=(4,)),
    read((1, 4), [], (1, 4)),
    LaneRead(LANE, 1, 4, expired=True),  # the server said so: a new epoch may follow
    read((0, 0), [(1, "m9")], (2, 1)),
]

BAD = {
    "gap": [read((0, 0), [(1, "m1")], (1, 1)), read((1, 1), [(3, "m3")], (1, 3))],
    "next-cursor": [read((0, 0), [(1, "m1"), (2, "m2")], (1, 1))],
    "silent-epoch": [read((0, 0), [(1, "m1")], (1, 1)), read((1, 1), [(1, "m2")], (2, 1))],
    "duplicate-entry": [read((0, 0), [(1, "m1"), (2, "m1")], (1, 2))],
    "reused-seq": [
        read((0, 0), [(1, "m1"), (2, "m2")], (1, 2)),
        LaneRead(LANE, 1, 2, expired=True),
        read((0, 0), [(1, "m1"), (2, "m7")], (1, 2)),
    ],
}


def test_a_gap_free_lane_with_a_said_new_epoch_passes() -> None:
    found = lanes.check(GOOD)
    assert found.anomalies == []
    assert (found.reads, found.entries, found.expired) == (5, 4, 1)


@pytest.mark.parametrize("rule", sorted(BAD))
def test_each_lane_rule_catches_its_history(rule: str) -> None:
    found = lanes.check(BAD[rule])
    assert [a.split(":")[0] for a in found.anomalies] == [rule]


# --- delivery: the devices' stores against History --------------------------------------


@dataclass
class Dev:
    user: str
    device: str
    events: list[dict[str, Any]] = field(default_factory=list)


def record(seq: int, message_id: str, cmid: str, device: str = "a", size: int = 5) -> MessageRecord:
    content = MessageContent(MessageType.TEXT, b"x" * size)
    return MessageRecord("acme", "c0", seq, message_id, "u0", device, cmid, content, (), "", 1000)


def world(
    *, confirmed_as: tuple[str, int] = ("m1", 1), held_seq: int = 1, b_holds: bool = True
) -> tuple[Ledger, dict[str, list[MessageRecord]], list[Dev], dict[Any, dict[str, Any]]]:
    ledger = Ledger(initial={"c0": {"u0"}})
    attempt = SendAttempt("u0", "a", "k1", "c0", 5, "normal", reply={"ev": "persisted"})
    ledger.record(attempt, 0.0)
    history = {"c0": [record(1, "m1", "k1")]}
    message_id, seq = confirmed_as
    said = {"ev": "confirmed", "cmid": "k1", "conversation": "c0", "message_id": message_id,
            "seq": seq, "via": "ack"}  # fmt: skip
    a = Dev("u0", "a", [{"ev": "started"}, said])
    b = Dev("u0", "b", [{"ev": "started"}, {"ev": "added", "ids": ["m1"] if b_holds else []}])
    held = {"held": {"c0": ["m1"]}, "seqs": {"c0": {"m1": held_seq}}, "pending": [], "parked": []}
    empty = {"held": {"c0": []}, "seqs": {"c0": {}}, "pending": [], "parked": []}
    statuses = {("u0", "a"): held, ("u0", "b"): held if b_holds else empty}
    return ledger, history, [a, b], statuses


def test_a_send_on_every_device_at_its_acks_coordinates_passes() -> None:
    found = delivery.check(*world())
    assert found.anomalies == []
    assert found.held == 2


@pytest.mark.parametrize(
    ("case", "rule"),
    [
        ({"held_seq": 2}, "coordinates"),
        ({"confirmed_as": ("m2", 2)}, "wrongly_confirmed"),
        ({"b_holds": False}, "lost"),
    ],
)
def test_each_delivery_rule_catches_its_history(case: dict[str, Any], rule: str) -> None:
    found = delivery.check(*world(**case))
    assert rule in {a.split(":")[0] for a in found.anomalies}


def test_a_pending_send_confirmed_by_the_other_devices_message_is_caught() -> None:
    ledger, history, devices, statuses = world()
    history["c0"] = [record(1, "m1", "k1", device="b", size=6)]  # b's, other content
    found = delivery.check(ledger, history, devices, statuses)
    assert any(a.startswith("wrongly_confirmed") for a in found.anomalies)


# --- every delivery sabotage mode names a rule with a failing history here ---------------

SHOWN_BY = {
    "skipped-entry": "lost",
    "duplicated-entry": "duplicate-entry",
    "reused-seq": "reused-seq",
    "confirmed-other": "wrongly_confirmed",
    "coordinates": "coordinates",
    "silent-epoch": "silent-epoch",
}
"""The rule each ``--sabotage`` delivery mode must make fire (docs/topologies.md)."""
DELIVERY_CASES: dict[str, dict[str, Any]] = {
    "coordinates": {"held_seq": 2},
    "wrongly_confirmed": {"confirmed_as": ("m2", 2)},
    "lost": {"b_holds": False},
}


def test_every_delivery_sabotage_mode_has_a_rule_with_a_failing_history() -> None:
    assert set(SHOWN_BY) == DELIVERY_MODES
    for mode, rule in SHOWN_BY.items():
        if rule in BAD:
            found = lanes.check(BAD[rule]).anomalies
        else:
            found = delivery.check(*world(**DELIVERY_CASES[rule])).anomalies
        assert rule in {a.split(":")[0] for a in found}, mode
