"""With a short idempotency window a key is used again after it expired: the checkers
take each use after the window as another key (``expiry.py``), and only that: a key
ACKed again sooner is still an anomaly."""

from __future__ import annotations

from typing import Any

from toolkit.nemesis.checker import check, summary
from toolkit.nemesis.expiry import MARGIN_MS, split
from toolkit.nemesis.history import load

WINDOW_MS = 30_000
T0 = 1_000_000


class Lines:
    """History lines by hand: one tenant, one conversation, sender alice."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.mono = 0

    def _add(self, row: dict[str, Any], wall_ms: int) -> None:
        self.mono += 1
        self.rows.append({**row, "wall_ms": wall_ms, "mono_ns": self.mono})

    def invoke(self, op: int, kind: str, wall_ms: int, cmid: str = "k") -> None:
        base = {"type": "invoke", "op": op, "process": 1, "kind": kind, "tenant": "t"}
        key = {"sender": "alice", "cmid": cmid, "digest": "d"} if kind != "read" else {}
        self._add({**base, "conversation": "c", **key}, wall_ms)

    def ack(self, op: int, seq: int, server_ts: int) -> None:
        row = {"type": "complete", "op": op, "outcome": "ok", "seq": seq,
               "message_id": f"m{seq}", "server_ts_ms": server_ts}  # fmt: skip
        self._add(row, server_ts)

    def final_read(self, op: int, wall_ms: int, *held: tuple[int, int]) -> None:
        self.invoke(op, "read", wall_ms)
        records = [{"seq": s, "message_id": f"m{s}", "sender": "alice", "cmid": "k",
                    "digest": "d", "server_ts_ms": ts} for s, ts in held]  # fmt: skip
        done = {"type": "complete", "op": op, "outcome": "ok", "records": records}
        self._add({**done, "last_seq": max(s for s, _ in held)}, wall_ms)

    def probe_not_found(self, op: int, wall_ms: int) -> None:
        self.invoke(op, "resume", wall_ms)
        self._add({"type": "complete", "op": op, "outcome": "not_found"}, wall_ms)


def _history(second_ts: int) -> Lines:
    """Key k ACKed at T0 (seq 1), sent again and ACKed at ``second_ts`` (seq 2); the
    final read holds both; the probe after the run finds the key expired."""
    h = Lines()
    h.invoke(1, "commit", T0 - 5)
    h.ack(1, 1, T0)
    h.invoke(2, "commit", second_ts - 5)
    h.ack(2, 2, second_ts)
    end = second_ts + WINDOW_MS + MARGIN_MS + 1000
    h.final_read(3, end, (1, T0), (2, second_ts))
    h.probe_not_found(4, end + 10)
    return h


def test_a_key_acked_again_after_its_window_is_another_key() -> None:
    h = _history(T0 + WINDOW_MS + 200)
    before = summary(check(load(h.rows)))
    assert before.get("ack-mismatch") and before.get("duplicate-message")
    rows, reused = split(h.rows, WINDOW_MS)
    assert reused == 1
    assert check(load(rows)) == []


def test_a_key_acked_again_within_its_window_is_still_an_anomaly() -> None:
    h = _history(T0 + WINDOW_MS // 2)
    rows, reused = split(h.rows, WINDOW_MS)
    assert reused == 0
    found = summary(check(load(rows)))
    assert found.get("ack-mismatch") == 1 and found.get("duplicate-message") == 1
