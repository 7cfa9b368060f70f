"""The project's own checker of a nemesis history (DESIGN §7, over real gRPC).

Tenant-wide, the refusal rules (``wrong-refusal``, ``non-member-acked``: ``keys.py``
with the table of ``outcomes.py``) and ``duplicate-message`` for a key recorded in
two conversations; per conversation, the reads taken during the run (``stale-read``,
``last-seq``, ``last-seq-shrank``...: ``reads.py``) and, against its final
full-history read (the last read invoked, when it returned):

* ``lost-ack``: an ACK whose key is not in the history;
* ``ack-not-at-seq``: an ACK whose key is in the history at another seq, or with
  another message id or server time (every ACK is there exactly once, at its seq,
  with its whole record);
* ``duplicate-seq``: one seq held by two records, or ACKed to two keys;
* ``duplicate-message``: one key recorded twice;
* ``ack-mismatch``: two ACKs of one key differ;
* ``conflict-acked``: a key ACKed to two different requests, or ACKed to a request
  other than the one its record holds (in this conversation or another);
* ``refused-took-effect``: a record holding a request that was only ever refused;
* ``phantom-record``: a record holding a request nobody sent;
* ``real-time-order``: commit A's ACK returned before commit B (another key) was
  invoked, yet B's seq is not greater than A's;
* ``unfinished``: after heal and recovery, a key that a resume probe finished only now
  (its ACK is not the record the final read saw), or could not finish, or an
  operation that never completed;
* ``record-without-intent``: a recorded key that a resume probe did not find;
* ``no-final-read``: a conversation with commits whose history could not be read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from toolkit.nemesis import reads
from toolkit.nemesis.history import Op, Record
from toolkit.nemesis.keys import Anomaly, Keys

__all__ = ["Anomaly", "check", "summary"]

Key = tuple[str, str]  # (sender, cmid) within one conversation's tenant


def check(ops: Iterable[Op]) -> list[Anomaly]:
    """Every anomaly the history shows, conversation by conversation."""
    every = list(ops)
    by_conversation: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in every:
        by_conversation[(op.tenant, op.conversation)].append(op)
    finals: dict[tuple[str, str], Op] = {}
    for where, conv_ops in by_conversation.items():
        read = [o for o in conv_ops if o.kind == "read"]
        last = max(read, key=lambda o: o.mono_ns) if read else None
        if last is not None and last.acked:  # a read during the run never stands in
            finals[where] = last
    keys = Keys.build(every, finals.values())
    found: list[Anomaly] = []
    for (tenant, conversation), conv_ops in sorted(by_conversation.items()):
        name = f"{tenant}/{conversation}"
        final = finals.get((tenant, conversation))
        found += _Conversation(name, conv_ops, final, keys).check()
        found += reads.check(name, conv_ops, final)
    found += keys.check(every)
    found += keys.in_two_conversations()
    return found


class _Conversation:
    def __init__(self, name: str, ops: list[Op], final: Op | None, keys: Keys) -> None:
        self.name = name
        self.keys = keys
        self.commits = [o for o in ops if o.kind == "commit"]
        self.resumes = [o for o in ops if o.kind == "resume"]
        self.final = final
        self.unfinished_ops = [o for o in ops if o.done is None and o.kind != "create"]
        self.anomalies: list[Anomaly] = []

    def flag(self, kind: str, detail: str) -> None:
        self.anomalies.append(Anomaly(kind, self.name, detail))

    def check(self) -> list[Anomaly]:
        for op in self.unfinished_ops:
            self.flag("unfinished", f"op {op.op} ({op.kind}) never completed")
        acks = [o for o in self.commits if o.acked]
        if self.final is None or self.final.done is None:
            if self.commits:
                self.flag("no-final-read", "no full-history read returned")
            return self.anomalies
        records = self.final.done.records
        by_key: dict[Key, list[Record]] = defaultdict(list)
        by_seq: dict[int, list[Record]] = defaultdict(list)
        for r in records:
            by_key[(r.sender, r.cmid)].append(r)
            by_seq[r.seq].append(r)
        self._records(by_key, by_seq)
        self._acks(acks, by_key)
        self._requests(by_key)
        self._real_time(acks)
        self._recovery(by_key)
        return self.anomalies

    def _records(self, by_key: dict[Key, list[Record]], by_seq: dict[int, list[Record]]) -> None:
        for seq, held in by_seq.items():
            if len(held) > 1:
                self.flag("duplicate-seq", f"seq {seq} holds {len(held)} records")
        for key, held in by_key.items():
            if len(held) > 1:
                seqs = sorted(r.seq for r in held)
                self.flag("duplicate-message", f"key {key} recorded at seqs {seqs}")

    def _acks(self, acks: list[Op], by_key: dict[Key, list[Record]]) -> None:
        first: dict[Key, Op] = {}
        keys_at_seq: dict[int, set[Key]] = defaultdict(set)
        for op in acks:
            assert op.done is not None
            key = (op.sender, op.cmid)
            done = op.done
            keys_at_seq[done.seq].add(key)
            earlier = first.setdefault(key, op)
            if earlier is not op:
                e = earlier.done
                assert e is not None
                if (e.seq, e.message_id, e.server_ts_ms) != (
                    done.seq,
                    done.message_id,
                    done.server_ts_ms,
                ):
                    self.flag("ack-mismatch", f"key {key}: seq {e.seq} then seq {done.seq}")
                if earlier.digest != op.digest:
                    self.flag("conflict-acked", f"key {key} ACKed to two different requests")
            held = by_key.get(key)
            elsewhere = self.keys.elsewhere(op.tenant, op.conversation, *key)
            if elsewhere:
                where = ", ".join(elsewhere)
                self.flag("conflict-acked", f"key {key} ACKed here, recorded in {where}")
            if not held:
                if not elsewhere:
                    self.flag("lost-ack", f"key {key} ACKed at seq {done.seq}, not in history")
                continue
            record = held[0]
            if (record.seq, record.message_id, record.server_ts_ms) != (
                done.seq,
                done.message_id,
                done.server_ts_ms,
            ):
                self.flag(
                    "ack-not-at-seq", f"key {key} ACKed at seq {done.seq}, recorded at {record.seq}"
                )
            elif record.digest != op.digest:
                self.flag("conflict-acked", f"key {key} ACKed to a request it does not hold")
        for seq, keys in keys_at_seq.items():
            if len(keys) > 1:
                self.flag("duplicate-seq", f"seq {seq} ACKed to {len(keys)} keys")

    def _requests(self, by_key: dict[Key, list[Record]]) -> None:
        """Each record must hold a request that was sent and not refused."""
        possible: dict[Key, set[str]] = defaultdict(set)
        refused: dict[Key, set[str]] = defaultdict(set)
        for op in self.commits:
            definite = op.done is not None and op.done.outcome == "error"
            (refused if definite else possible)[(op.sender, op.cmid)].add(op.digest)
        for key, held in by_key.items():
            for r in held:
                if r.digest in possible[key]:
                    continue
                kind = "refused-took-effect" if r.digest in refused[key] else "phantom-record"
                self.flag(kind, f"key {key} at seq {r.seq}")

    def _real_time(self, acks: list[Op]) -> None:
        """Key B first invoked after A's ACK returned (A another key): seq(B) > seq(A).
        A key takes effect at most once, no earlier than its first invocation (a later
        replay rightly returns the old seq). One sweep: ACKs by return time, keys by
        first invocation, keeping the two largest seqs of distinct keys returned so far."""
        first_call: dict[Key, int] = {}
        for op in self.commits:
            key = (op.sender, op.cmid)
            first_call[key] = min(first_call.get(key, op.mono_ns), op.mono_ns)
        seq_of: dict[Key, int] = {}
        for op in acks:
            assert op.done is not None
            seq_of.setdefault((op.sender, op.cmid), op.done.seq)
        returned = sorted(acks, key=lambda o: o.done.mono_ns if o.done else 0)
        top: list[tuple[int, Key]] = []  # up to two (seq, key), distinct keys, largest first
        i = 0
        for key in sorted(seq_of, key=lambda k: first_call[k]):
            while i < len(returned):
                a = returned[i]
                assert a.done is not None
                if a.done.mono_ns >= first_call[key]:
                    break
                top = _keep_top(top, (a.done.seq, (a.sender, a.cmid)))
                i += 1
            for seq, other in top:
                if other != key and seq >= seq_of[key]:
                    self.flag(
                        "real-time-order",
                        f"key {key} got seq {seq_of[key]} after key {other} had returned seq {seq}",
                    )
                    break

    def _recovery(self, by_key: dict[Key, list[Record]]) -> None:
        for op in self.resumes:
            key = (op.sender, op.cmid)
            done = op.done
            if done is None:
                continue  # already flagged as never completed
            held = by_key.get(key)
            if done.outcome == "not_found":
                if held:
                    self.flag("record-without-intent", f"key {key} recorded, intent not found")
            elif done.outcome == "error" and done.code == "ALREADY_EXISTS":
                if not held or held[0].digest == op.digest:
                    self.flag("unfinished", f"key {key}: refused as a conflict, but not held")
            elif done.outcome != "ok":
                self.flag("unfinished", f"key {key}: resume after recovery: {done.reason}")
            elif not held or held[0].seq != done.seq or held[0].message_id != done.message_id:
                self.flag("unfinished", f"key {key} was committed only after recovery")


def _keep_top(top: list[tuple[int, Key]], item: tuple[int, Key]) -> list[tuple[int, Key]]:
    merged = sorted([*[t for t in top if t[1] != item[1]], item], reverse=True)
    same = [t for t in top if t[1] == item[1]]
    if same and same[0][0] > item[0]:
        merged = sorted([*[t for t in top if t[1] != item[1]], same[0]], reverse=True)
    return merged[:2]


def summary(anomalies: list[Anomaly]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for a in anomalies:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    return counts
