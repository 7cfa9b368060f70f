"""Keys that expire during a run: each use of a key after its window is another key.

docs/guarantees.md: "the same request after the idempotency window: a new message:
the key is free again". With ``--idempotency-window`` short, a key is re-reserved
during the run, so one key may hold several records and several different ACKs.
The checkers hold a key to one record and one ACK; rather than weaken that, this
splits every tenant-wide key into generations before they run: a key's times (the
server times of its ACKs and of the records the reads show) are sorted, and a time at
least ``window - MARGIN_MS`` after the start of the current generation begins the
next. ACKs and records then belong to the generation of their server time, a call
with an unknown outcome to the first generation that began while it ran (it may be
what began it), every other call to that of its invocation's wall time, and the
generation is written into the cmid (``c1-4~1``). A resume probe that found nothing
a window (plus the margin) after its key's last generation began asked about an
expired key (``~expired``: no record is its). A key re-used sooner than the window
stays one generation, so the checkers still report it (``ack-mismatch``,
``duplicate-message``).
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from toolkit.nemesis.history import read_lines

MARGIN_MS = 3500
"""The error of a server time: the Scylla clock guard (3 s), or a Redis replica's
offset measured through a slow proxy (half the round trip), plus 0.5 s."""

KeyId = tuple[str, str, str]


def split(lines: Iterable[dict[str, Any]], window_ms: int) -> tuple[list[dict[str, Any]], int]:
    """The history with each key's generations told apart, and how many keys were
    re-reserved (held more than one generation)."""
    rows = [dict(line) for line in lines]
    invokes = {r["op"]: r for r in rows if r["type"] == "invoke"}
    times: dict[KeyId, set[int]] = defaultdict(set)
    for r in rows:
        if r["type"] != "complete" or r.get("outcome") != "ok":
            continue
        inv = invokes[r["op"]]
        if inv["kind"] in ("commit", "resume"):
            times[_key(inv)].add(int(r["server_ts_ms"]))
        for rec in r.get("records", ()):
            times[(inv["tenant"], rec["sender"], rec["cmid"])].add(int(rec["server_ts_ms"]))
    starts: dict[KeyId, list[int]] = {}
    for key, seen in times.items():
        firsts: list[int] = []
        for t in sorted(seen):
            if not firsts or t - firsts[-1] >= window_ms - MARGIN_MS:
                firsts.append(t)
        starts[key] = firsts
    completion = {r["op"]: r for r in rows if r["type"] == "complete"}
    for inv in invokes.values():
        if inv["kind"] not in ("commit", "resume"):
            continue
        done = completion.get(inv["op"])
        acked = done is not None and done.get("outcome") == "ok"
        at = int(done["server_ts_ms"]) if acked and done is not None else int(inv["wall_ms"])
        firsts = starts.get(_key(inv), [])
        if _expired(inv, done, firsts, window_ms):  # found nothing: the key had expired
            inv["cmid"] = f"{inv['cmid']}~expired"
            continue
        if not acked and (done is None or done.get("outcome") == "unknown"):
            at = _began_during(firsts, int(inv["wall_ms"]), done) or at
        inv["cmid"] = _named(inv["cmid"], firsts, at)
    for r in rows:
        if r["type"] == "complete" and r.get("records"):
            tenant = invokes[r["op"]]["tenant"]
            for rec in r["records"]:
                firsts = starts.get((tenant, rec["sender"], rec["cmid"]), [])
                rec["cmid"] = _named(rec["cmid"], firsts, int(rec["server_ts_ms"]))
    return rows, sum(1 for firsts in starts.values() if len(firsts) > 1)


def _expired(
    invoke: dict[str, Any], done: dict[str, Any] | None, starts: list[int], window_ms: int
) -> bool:
    """A resume that found nothing, invoked a window after its key's last generation
    began: the key had expired (ResumeExisting answers not found past the window)."""
    if invoke["kind"] != "resume" or done is None or done.get("outcome") != "not_found":
        return False
    return not starts or int(invoke["wall_ms"]) >= starts[-1] + window_ms + MARGIN_MS


def _began_during(starts: list[int], invoked_ms: int, done: dict[str, Any] | None) -> int:
    """The first generation that began while an unknown-outcome call ran (its start,
    0 for none): the call may be what began it."""
    until = int(done["wall_ms"]) + MARGIN_MS if done is not None else None
    for start in starts:
        if start >= invoked_ms - MARGIN_MS and (until is None or start <= until):
            return start
    return 0


def _key(invoke: dict[str, Any]) -> KeyId:
    return (invoke["tenant"], invoke["sender"], invoke["cmid"])


def _named(cmid: str, starts: list[int], at_ms: int) -> str:
    generation = max(0, bisect.bisect_right(starts, at_ms) - 1)
    return f"{cmid}~{generation}" if generation else cmid


def split_file(path: Path, window_ms: int) -> tuple[Path, int]:
    """``split`` of a history file, written beside it (``.generations.jsonl``)."""
    rows, reused = split(read_lines(path), window_ms)
    out = path.with_suffix(".generations.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return out, reused
