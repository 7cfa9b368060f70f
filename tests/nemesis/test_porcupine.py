"""The porcupine checker (Go), built by the nemesis's own ``build``, on hand-made
histories written with the nemesis's HistoryWriter: a linearizable one passes, and
a lost ACK, a second seq for one key and a stale read are each reported."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from toolkit.nemesis.history import HistoryWriter, Record
from toolkit.nemesis.linearizability import run


def write(path: Path, body: Callable[[HistoryWriter], None]) -> Path:
    w = HistoryWriter(path)
    body(w)
    w.close()
    return path


def commit(w: HistoryWriter, cmid: str, seq: int | None, process: int = 1) -> None:
    op = w.invoke(process, "commit", "t", "c1", sender="alice", cmid=cmid, digest=f"d-{cmid}")
    if seq is None:
        w.unknown(op, "timeout")
    else:
        w.ok(op, seq, f"m-{cmid}", 7)


def read(w: HistoryWriter, *records: tuple[str, int]) -> None:
    op = w.invoke(0, "read", "t", "c1")
    rows = [Record(seq, f"m-{c}", "alice", c, f"d-{c}", 7) for c, seq in records]
    w.read_ok(op, rows, max((s for _, s in records), default=0))


def test_a_linearizable_history_passes(tmp_path: Path) -> None:
    def body(w: HistoryWriter) -> None:
        commit(w, "a", 1)
        commit(w, "b", None)  # unknown, recovered at seq 2
        commit(w, "c", 3)
        commit(w, "a", 1)  # a replay
        commit(w, "d", None)  # unknown, never took effect
        read(w, ("a", 1), ("b", 2), ("c", 3))

    result = run(write(tmp_path / "h.jsonl", body))
    assert result.anomalies == 0, result.output


def lost_ack(w: HistoryWriter) -> None:
    commit(w, "a", 1)
    read(w)


def second_seq(w: HistoryWriter) -> None:
    commit(w, "a", 1)
    commit(w, "a", 2)
    read(w, ("a", 1))


def real_time_order(w: HistoryWriter) -> None:
    commit(w, "a", 2)
    commit(w, "b", 1)
    read(w, ("a", 2), ("b", 1))


@pytest.mark.parametrize("body", [lost_ack, second_seq, real_time_order])
def test_anomalies_are_reported(tmp_path: Path, body: Callable[[HistoryWriter], None]) -> None:
    html = tmp_path / "failing.html"
    result = run(write(tmp_path / "h.jsonl", body), html=html)
    assert result.anomalies == 1, result.output
    assert html.exists() and "<html" in html.read_text()[:2000].lower()


def wrong_refusal(w: HistoryWriter) -> None:
    commit(w, "a", 1)
    op = w.invoke(1, "commit", "t", "c1", sender="alice", cmid="a", digest="d-other")
    w.error(op, "FAILED_PRECONDITION", "IDEMPOTENCY_CONFLICT")
    read(w, ("a", 1))


def test_a_refusal_the_table_does_not_allow_is_reported(tmp_path: Path) -> None:
    result = run(write(tmp_path / "h.jsonl", wrong_refusal))
    assert result.anomalies == 1, result.output


def test_a_conflict_refused_as_the_table_says_passes(tmp_path: Path) -> None:
    def body(w: HistoryWriter) -> None:
        commit(w, "a", 1)
        op = w.invoke(1, "commit", "t", "c1", sender="alice", cmid="a", digest="d-other")
        w.error(op, "ALREADY_EXISTS", "IDEMPOTENCY_CONFLICT")
        read(w, ("a", 1))

    result = run(write(tmp_path / "h.jsonl", body))
    assert result.anomalies == 0, result.output
