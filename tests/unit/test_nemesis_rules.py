"""The nemesis checker's stricter rules (issue 25), one synthetic history per rule:
refusals must be ones the situation allows, a replay must return the identical ACK,
a key reused in another conversation must be refused, and reads taken during the run
must show every message ACKed before they began (with a ``last_seq`` that covers it)
and nothing that was never sent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from toolkit.nemesis.checker import check, summary
from toolkit.nemesis.history import Completion, Op, Record
from toolkit.nemesis.replicas import REPO
from toolkit.nemesis.sabotage import DELIVERY_MODES, MODES, broken_build


class H:
    """A history under construction; times are ticks. Digests name key and conversation."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    @staticmethod
    def digest(cmid: str, conv: str) -> str:
        return f"d-{cmid}" if conv == "c1" else f"d-{cmid}-{conv}"

    def commit(self, cmid: str, call: int, done: Completion | None, conv: str = "c1",
               digest: str = "", sender: str = "alice") -> Op:  # fmt: skip
        op = Op(len(self.ops) + 1, 1, "commit", "t", conv, call, sender, cmid,
                digest or self.digest(cmid, conv), done)  # fmt: skip
        self.ops.append(op)
        return op

    def ack(self, cmid: str, seq: int, call: int, ret: int, conv: str = "c1",
            digest: str = "", mid: str = "", sender: str = "alice") -> Op:  # fmt: skip
        done = Completion("ok", ret, seq, mid or f"m-{cmid}", 7)
        return self.commit(cmid, call, done, conv, digest, sender)

    def refused(self, cmid: str, code: str, reason: str, call: int, conv: str = "c1",
                digest: str = "", sender: str = "alice") -> Op:  # fmt: skip
        done = Completion("error", call + 1, code=code, reason=reason)
        return self.commit(cmid, call, done, conv, digest, sender)

    def create(self, conv: str, *members: str) -> Op:
        self.ops.append(Op(len(self.ops) + 1, 0, "create", "t", conv, 0, members=members))
        return self.ops[-1]

    def read_refused(self, call: int, code: str) -> Op:
        done = Completion("error", call + 1, code=code, reason="NOT_A_MEMBER")
        self.ops.append(Op(len(self.ops) + 1, 2, "read", "t", "c1", call, done=done))
        return self.ops[-1]

    def read(self, call: int, ret: int, *records: tuple[str, int], conv: str = "c1",
             sender: str = "alice", **extra: int) -> Op:  # fmt: skip
        rows = tuple(
            Record(seq, f"m-{cmid}", sender, cmid, self.digest(cmid, conv), 7)
            for cmid, seq in records
        )
        last_seq = extra.get("last_seq", max((r.seq for r in rows), default=0))
        done = Completion("ok", ret, records=rows, last_seq=last_seq)
        op = Op(len(self.ops) + 1, 2, "read", "t", conv, call, done=done)
        self.ops.append(op)
        return op


def kinds(h: H) -> dict[str, int]:
    return summary(check(h.ops))


CONFLICT = ("ALREADY_EXISTS", "IDEMPOTENCY_CONFLICT")


def good() -> H:
    h = H()
    h.ack("a", 1, 10, 20)
    h.read(25, 30, ("a", 1))  # during the run
    h.ack("a", 1, 40, 50)  # a replay: the identical ACK
    h.refused("a", *CONFLICT, 60, digest="d-a-edited")  # same conversation, other content
    h.refused("a", *CONFLICT, 70, conv="c2")  # the key reused in another conversation
    h.ack("b", 1, 80, 90, conv="c2")
    h.read(1000, 1001, ("a", 1))
    h.read(1000, 1001, ("b", 1), conv="c2")
    return h


def test_a_good_history_with_replays_reuse_and_reads_has_no_anomaly() -> None:
    assert check(good().ops) == []


RULES: dict[str, tuple[Callable[[H], object], str]] = {
    "a conflict refused with another code": (
        lambda h: (h.ack("a", 1, 10, 20),
                   h.refused("a", "FAILED_PRECONDITION", "IDEMPOTENCY_CONFLICT", 30,
                             digest="d-x"),
                   h.read(1000, 1001, ("a", 1))),
        "wrong-refusal",
    ),
    "ALREADY_EXISTS for a key nothing else holds": (
        lambda h: (h.refused("a", *CONFLICT, 10), h.read(1000, 1001)),
        "wrong-refusal",
    ),
    "a replay of an ACKed key refused": (
        lambda h: (h.ack("a", 1, 10, 20), h.refused("a", *CONFLICT, 30),
                   h.read(1000, 1001, ("a", 1))),
        "wrong-refusal",
    ),
    "a replay answered with other coordinates": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 2, 30, 40, mid="m-x"),
                   h.read(1000, 1001, ("a", 1))),
        "ack-mismatch",
    ),
    "a key reused in another conversation ACKed": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 1, 30, 40, conv="c2"),
                   h.read(1000, 1001, ("a", 1)), h.read(1000, 1001, ("a", 1), conv="c2")),
        "conflict-acked",
    ),
    "a read during the run misses a message ACKed before it began": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("b", 2, 30, 40), h.read(50, 60, ("a", 1)),
                   h.read(1000, 1001, ("a", 1), ("b", 2))),
        "stale-read",
    ),
    "a read during the run shows a message nobody sent": (
        lambda h: (h.ack("a", 1, 10, 20), h.read(50, 60, ("a", 1), ("z", 2)),
                   h.read(1000, 1001, ("a", 1))),
        "phantom-record",
    ),
    "last_seq below a seq ACKed before the read began": (
        lambda h: (h.ack("a", 3, 10, 20), h.read(50, 60, ("a", 3), last_seq=2),
                   h.read(1000, 1001, ("a", 3))),
        "last-seq",
    ),
    "last_seq below a seq the read shows": (
        lambda h: (h.read(50, 60, ("a", 3), last_seq=2), h.read(1000, 1001, ("a", 3))),
        "last-seq",
    ),
    "last_seq shrinks across reads that do not overlap": (
        lambda h: (h.ack("a", 1, 10, 20), h.read(50, 60, ("a", 1), last_seq=5),
                   h.read(70, 80, ("a", 1), last_seq=4), h.read(1000, 1001, ("a", 1))),
        "last-seq-shrank",
    ),
    "a non-member's send ACKed": (
        lambda h: (h.create("c1", "alice"), h.ack("a", 1, 10, 20, sender="mallory"),
                   h.read(1000, 1001, ("a", 1), sender="mallory")),
        "non-member-acked",
    ),
    "NOT_A_MEMBER for a member": (
        lambda h: (h.create("c1", "alice"), h.refused("a", "PERMISSION_DENIED", "NOT_A_MEMBER", 10),
                   h.read(1000, 1001)),
        "wrong-refusal",
    ),
    "ALREADY_EXISTS before the holder was sent": (
        lambda h: (h.refused("a", *CONFLICT, 10, digest="d-x"), h.ack("a", 1, 30, 40),
                   h.read(1000, 1001, ("a", 1))),
        "wrong-refusal",
    ),
    "a read by a member refused": (
        lambda h: (h.ack("a", 1, 10, 20), h.read_refused(30, "PERMISSION_DENIED"),
                   h.read(1000, 1001, ("a", 1))),
        "wrong-refusal",
    ),
    "a key recorded in two conversations": (
        lambda h: (h.ack("a", 1, 10, 20), h.read(1000, 1001, ("a", 1)),
                   h.read(1000, 1001, ("a", 1), conv="c2")),
        "duplicate-message",
    ),
    "a key ACKed in another conversation than the one holding it": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 1, 30, 40, conv="c2", mid="m-y"),
                   h.read(1000, 1001, ("a", 1)), h.read(1000, 1001, conv="c2")),
        "conflict-acked",
    ),
}  # fmt: skip


def test_a_non_member_refused_is_no_anomaly() -> None:
    h = H()
    h.create("c1", "alice")
    h.refused("z", "PERMISSION_DENIED", "NOT_A_MEMBER", 10, sender="mallory")
    h.ack("a", 1, 20, 30)
    h.read(1000, 1001, ("a", 1))
    assert check(h.ops) == []


def test_an_unknown_outcome_is_allowed_in_every_situation() -> None:
    h = H()
    h.ack("a", 1, 10, 20)
    h.commit("a", 30, Completion("unknown", 40, reason="CANCELLED"))  # a replay
    h.commit("a", 50, Completion("unknown", 60, reason="UNAVAILABLE"), digest="d-x")
    h.read(1000, 1001, ("a", 1))
    assert check(h.ops) == []


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_is_checked(rule: str) -> None:
    build, kind = RULES[rule]
    h = H()
    build(h)
    assert kind in kinds(h), kinds(h)


SABOTAGED: dict[str, tuple[Callable[[H], object], str]] = {
    "identity": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 1, 30, 40, digest="d-a-edited"),
                   h.read(1000, 1001, ("a", 1))),
        "conflict-acked",
    ),
    "changed-replay": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 2, 30, 40), h.read(1000, 1001, ("a", 1))),
        "ack-mismatch",
    ),
    "wrong-refusal": (
        lambda h: (h.ack("a", 1, 10, 20),
                   h.refused("a", "FAILED_PRECONDITION", "IDEMPOTENCY_CONFLICT", 30,
                             digest="d-a-edited"),
                   h.read(1000, 1001, ("a", 1))),
        "wrong-refusal",
    ),
    "stale-read": (
        lambda h: (h.ack("a", 1, 10, 20), h.ack("b", 2, 30, 40),
                   h.read(50, 60, ("a", 1), last_seq=2), h.read(1000, 1001, ("a", 1), last_seq=2)),
        "stale-read",
    ),
}  # fmt: skip
"""What each sabotage mode makes a history look like, and the rule that must catch it."""


def test_every_sabotage_mode_has_a_synthetic_history() -> None:
    """Commit modes here; the delivery modes' rules have theirs in test_e2e_checks."""
    assert set(MODES) >= DELIVERY_MODES
    assert set(SABOTAGED) == set(MODES) - DELIVERY_MODES


@pytest.mark.parametrize("mode", sorted(SABOTAGED))
def test_each_sabotage_mode_is_caught_on_a_synthetic_history(mode: str) -> None:
    build, kind = SABOTAGED[mode]
    h = H()
    build(h)
    assert kind in kinds(h), kinds(h)


def test_every_sabotage_mode_still_finds_the_lines_it_breaks(tmp_path: Path) -> None:
    for mode in MODES:
        root = broken_build(REPO, tmp_path, mode, compiled=False)
        for edit in MODES[mode].edits:
            source = (root / edit.path).read_text()
            assert edit.broken in source
            compile(source, edit.path, "exec")  # the broken copy still imports


def test_a_read_during_the_run_never_stands_in_for_a_failed_final_read() -> None:
    h = H()
    h.ack("a", 1, 10, 20)
    h.read(30, 40, ("a", 1))
    h.ack("b", 2, 50, 60)
    h.commit("c", 1000, Completion("unknown", 1001, reason="UNAVAILABLE"))
    h.ops.append(Op(len(h.ops) + 1, 0, "read", "t", "c1", 2000, done=Completion("unknown", 2001)))
    assert kinds(h) == {"no-final-read": 1}
