"""The nemesis's own checker on hand-made histories: a good one passes, and each
anomaly kind is caught by its own check (and written/read back through JSONL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import text
from toolkit.nemesis.checker import check, summary
from toolkit.nemesis.history import (
    Completion,
    HistoryWriter,
    Op,
    Record,
    load_file,
    request_digest,
)


class H:
    """A history under construction; times are ticks."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def commit(self, cmid: str, digest: str, call: int, done: Completion | None) -> Op:
        op = Op(len(self.ops) + 1, 1, "commit", "t", "c1", call, "alice", cmid, digest, done)
        self.ops.append(op)
        return op

    def ack(self, cmid: str, seq: int, call: int, ret: int, digest: str = "", mid: str = "") -> Op:
        done = Completion("ok", ret, seq, mid or f"m-{cmid}", 7)
        return self.commit(cmid, digest or f"d-{cmid}", call, done)

    def refused(self, cmid: str, digest: str, call: int) -> Op:
        done = Completion("error", call + 1, code="ALREADY_EXISTS", reason="IDEMPOTENCY_CONFLICT")
        return self.commit(cmid, digest, call, done)

    def unknown(self, cmid: str, call: int) -> Op:
        return self.commit(cmid, f"d-{cmid}", call, Completion("unknown", call + 1, reason="t"))

    def resume(self, cmid: str, done: Completion) -> None:
        self.ops.append(Op(len(self.ops) + 1, 0, "resume", "t", "c1", 900, "alice", cmid,
                           f"d-{cmid}", done))  # fmt: skip

    def read(self, *records: tuple[str, int] | Record) -> None:
        rows = tuple(
            r if isinstance(r, Record) else Record(r[1], f"m-{r[0]}", "alice", r[0], f"d-{r[0]}", 7)
            for r in records
        )
        done = Completion("ok", 1001, records=rows, last_seq=max((r.seq for r in rows), default=0))
        self.ops.append(Op(len(self.ops) + 1, 0, "read", "t", "c1", 1000, done=done))


def kinds(h: H) -> dict[str, int]:
    return summary(check(h.ops))


def good() -> H:
    h = H()
    h.ack("a", 1, 10, 20)
    h.ack("b", 3, 15, 30)  # concurrent with nothing that returned before it: any seq
    h.ack("a", 1, 40, 50)  # a replay
    h.refused("a", "d-other", 60)
    h.unknown("c", 70)  # took effect (recovery), seq 4
    h.unknown("d", 80)  # never took effect
    h.resume("c", Completion("ok", 901, 4, "m-c", 7))
    h.resume("d", Completion("not_found", 901))
    h.read(("a", 1), ("b", 3), ("c", 4))
    return h


def test_a_good_history_has_no_anomaly() -> None:
    assert check(good().ops) == []


def test_a_good_history_survives_the_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    w = HistoryWriter(path)
    op = w.invoke(1, "commit", "t", "c1", sender="alice", cmid="a", digest="d-a")
    w.fault("kill-cql-node", "node2", "start")
    w.ok(op, 1, "m-a", 7)
    read = w.invoke(0, "read", "t", "c1")
    w.read_ok(read, [Record(1, "m-a", "alice", "a", "d-a", 7)], last_seq=1)
    w.close()
    ops = load_file(path)
    assert [o.kind for o in ops] == ["commit", "read"]
    assert check(ops) == []


@pytest.mark.parametrize(
    ("build", "kind"),
    [
        (lambda h: (h.ack("a", 1, 10, 20), h.read()), "lost-ack"),
        (lambda h: (h.ack("a", 1, 10, 20), h.read(("a", 2))), "ack-not-at-seq"),
        (lambda h: (h.ack("a", 1, 10, 20, mid="m-x"), h.read(("a", 1))), "ack-not-at-seq"),
        (lambda h: (h.ack("a", 1, 10, 20), h.ack("b", 1, 10, 20), h.read(("a", 1))),
         "duplicate-seq"),
        (lambda h: (h.read(("a", 1), ("b", 1))), "duplicate-seq"),
        (lambda h: (h.ack("a", 1, 10, 20), h.read(("a", 1), ("a", 2))), "duplicate-message"),
        (lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 2, 30, 40), h.read(("a", 1))),
         "ack-mismatch"),
        (lambda h: (h.ack("a", 1, 10, 20), h.ack("a", 1, 30, 40, digest="d-other"),
                    h.read(("a", 1))), "conflict-acked"),
        (lambda h: (h.ack("a", 1, 10, 20, digest="d-other"),
                    h.read(Record(1, "m-a", "alice", "a", "d-a", 7))), "conflict-acked"),
        (lambda h: (h.refused("a", "d-a", 10), h.read(("a", 1))), "refused-took-effect"),
        (lambda h: (h.read(("z", 1))), "phantom-record"),
        (lambda h: (h.ack("a", 2, 10, 20), h.ack("b", 1, 30, 40), h.read(("a", 2), ("b", 1))),
         "real-time-order"),
        (lambda h: (h.unknown("c", 10), h.resume("c", Completion("ok", 901, 1, "m-c", 7)),
                    h.read()), "unfinished"),
        (lambda h: (h.unknown("c", 10), h.resume("c", Completion("unknown", 901, reason="x")),
                    h.read()), "unfinished"),
        (lambda h: (h.commit("c", "d-c", 10, None), h.read()), "unfinished"),
        (lambda h: (h.ack("a", 1, 10, 20), h.resume("a", Completion("not_found", 901)),
                    h.read(("a", 1))), "record-without-intent"),
        (lambda h: h.ack("a", 1, 10, 20), "no-final-read"),
    ],
)  # fmt: skip
def test_each_anomaly_kind_is_caught(build: object, kind: str) -> None:
    h = H()
    build(h)  # type: ignore[operator]
    assert kind in kinds(h), kinds(h)


def test_concurrent_commits_may_take_seqs_in_either_order() -> None:
    h = H()
    h.ack("a", 2, 10, 30)
    h.ack("b", 1, 20, 40)  # invoked before a returned
    h.read(("a", 2), ("b", 1))
    assert check(h.ops) == []


def test_the_digest_covers_every_part_of_the_identity() -> None:
    base = dict(tenant="t", sender="s", device="d", conversation="c", cmid="m",
                content=text("hi"), mentions=("u",), reply_to="")  # fmt: skip
    first = request_digest(**base)  # type: ignore[arg-type]
    for change in ({"device": "e"}, {"content": text("ho")}, {"mentions": ()},
                   {"reply_to": "x"}, {"conversation": "c2"}):  # fmt: skip
        assert request_digest(**{**base, **change}) != first  # type: ignore[arg-type]
