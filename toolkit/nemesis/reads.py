"""Checks of the History reads a run takes during the load (and ``last_seq`` of all).

A read is paged (forward, 200 records a page), so it is not one snapshot: records
committed while it pages may or may not show. What is sound anyway, per read R of
one conversation (times are the history's monotonic clock):

* ``stale-read``: a commit ACKed before R was invoked is missing from R, or shows
  at another seq, message id, server time or content (read-your-writes: every page
  is read after the ACK). Not applied to the final read: ``lost-ack`` is its rule.
* ``phantom-record``: R shows a request that no commit invoked before R returned
  sent, or that was only ever refused (for the final read, ``_requests``).
* ``duplicate-seq`` / ``duplicate-message``: R shows one seq twice, or one key twice.
* ``last-seq``: R's ``last_seq`` (its last page's: the highest seq allocated so far)
  is below a seq ACKed before R was invoked, or below a seq R itself shows.
* ``last-seq-shrank``: R2 was invoked after R1 returned, yet R2's ``last_seq`` is below
  R1's. Gaps (a lost reservation race, an unfinished intent) never lower the highest
  seq allocated, so this holds with gaps; it assumes a read never sees an allocation
  a failover then takes back (Redis with Sentinel serves reads from the master
  without waiting for a replica; a finding there would be that).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from toolkit.nemesis.history import Op, Record
from toolkit.nemesis.keys import Anomaly


def check(name: str, ops: list[Op], final: Op | None) -> list[Anomaly]:
    """Every anomaly of the completed reads of one conversation's ``ops``."""
    reads = sorted((o for o in ops if o.kind == "read" and o.acked), key=lambda o: o.mono_ns)
    acks = sorted(
        (o for o in ops if o.kind == "commit" and o.acked),
        key=lambda o: o.done.mono_ns if o.done else 0,
    )
    found: list[Anomaly] = []
    for read in reads:
        assert read.done is not None
        found += _one(name, read, acks, ops, during=read is not final)
    found += _shrank(name, reads)
    return found


def _one(name: str, read: Op, acks: list[Op], ops: list[Op], during: bool) -> list[Anomaly]:
    done = read.done
    assert done is not None
    found: list[Anomaly] = []

    def flag(kind: str, detail: str) -> None:
        found.append(Anomaly(kind, name, f"read op {read.op}: {detail}"))

    by_key: dict[tuple[str, str], Record] = {}
    seqs: set[int] = set()
    for r in done.records:
        if r.seq in seqs and during:
            flag("duplicate-seq", f"seq {r.seq} shown twice")
        if (r.sender, r.cmid) in by_key and during:
            flag("duplicate-message", f"key {(r.sender, r.cmid)} shown twice")
        seqs.add(r.seq)
        by_key[(r.sender, r.cmid)] = r
    highest_acked = 0
    for op in acks:
        ack = op.done
        assert ack is not None
        if ack.mono_ns >= read.mono_ns:
            break
        highest_acked = max(highest_acked, ack.seq)
        if not during:
            continue
        shown_at = by_key.get((op.sender, op.cmid))
        if shown_at is None:
            flag("stale-read", f"key {(op.sender, op.cmid)} ACKed at seq {ack.seq} is missing")
        elif (shown_at.seq, shown_at.message_id, shown_at.server_ts_ms, shown_at.digest) != (
            ack.seq,
            ack.message_id,
            ack.server_ts_ms,
            op.digest,
        ):
            flag(
                "stale-read", f"key {(op.sender, op.cmid)} ACKed at seq {ack.seq}, shown at {r.seq}"
            )
    shown = max(seqs, default=0)
    if done.last_seq < max(highest_acked, shown):
        flag("last-seq", f"last_seq {done.last_seq} below seq {max(highest_acked, shown)}")
    if during:
        found += _phantoms(name, read, done.records, ops)
    return found


def _phantoms(name: str, read: Op, records: Iterable[Record], ops: list[Op]) -> list[Anomaly]:
    assert read.done is not None
    sent: dict[tuple[str, str], set[str]] = defaultdict(set)
    refused: dict[tuple[str, str], set[str]] = defaultdict(set)
    for op in ops:
        if op.kind != "commit" or op.mono_ns >= read.done.mono_ns:
            continue
        definite = op.done is not None and op.done.outcome == "error"
        (refused if definite else sent)[(op.sender, op.cmid)].add(op.digest)
    found: list[Anomaly] = []
    for r in records:
        key = (r.sender, r.cmid)
        if r.digest not in sent[key]:
            kind = "refused-took-effect" if r.digest in refused[key] else "phantom-record"
            found.append(Anomaly(kind, name, f"read op {read.op}: key {key} at seq {r.seq}"))
    return found


def _shrank(name: str, reads: list[Op]) -> list[Anomaly]:
    """One sweep: reads by invocation, the largest last_seq of reads returned before."""
    returned = sorted(reads, key=lambda o: o.done.mono_ns if o.done else 0)
    found: list[Anomaly] = []
    best, i = 0, 0
    for read in reads:
        assert read.done is not None
        while i < len(returned):
            earlier = returned[i].done
            assert earlier is not None
            if earlier.mono_ns >= read.mono_ns:
                break
            best = max(best, earlier.last_seq)
            i += 1
        if read.done.last_seq < best:
            found.append(
                Anomaly(
                    "last-seq-shrank",
                    name,
                    f"read op {read.op}: last_seq {read.done.last_seq} after {best}",
                )
            )
    return found
