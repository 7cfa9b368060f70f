"""Tenant-wide facts of a history, and the refusal rules (``outcomes.py``) over them.

A commit key (tenant, sender, cmid) is tenant-wide: a request reusing it in another
conversation is another request (the identity digest names the conversation) and
must be refused. So who holds a key is read from every conversation's final read,
and each commit's situation (``outcomes.Situation``) is decided from that:

* ``wrong-refusal``: a commit ended with a definite answer its situation does not
  allow (ALREADY_EXISTS while no other request, sent before the refusal returned,
  holds the key; a replay of an ACKed request refused; another code for a conflict;
  NOT_A_MEMBER for a member; any code outside the table), or a read by a member
  was refused;
* ``non-member-acked``: a send by a sender who is not a member was ACKed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from toolkit.nemesis import outcomes
from toolkit.nemesis.history import Op, Record

TKey = tuple[str, str, str]  # (tenant, sender, cmid)


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str
    conversation: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} in {self.conversation}: {self.detail}"


@dataclass
class Keys:
    """Who holds each key (final reads), when each request was first sent, who is a member."""

    holders: dict[TKey, list[tuple[str, Record]]] = field(default_factory=dict)
    first_call: dict[tuple[TKey, str], int] = field(default_factory=dict)
    first_ack: dict[tuple[TKey, str], int] = field(default_factory=dict)
    members: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    @classmethod
    def build(cls, ops: Iterable[Op], finals: Iterable[Op]) -> Keys:
        keys = cls()
        for op in ops:
            if op.kind == "create":
                keys.members[(op.tenant, op.conversation)] = frozenset(op.members)
            if op.kind != "commit":
                continue
            at = (op.key, op.digest)
            keys.first_call[at] = min(keys.first_call.get(at, op.mono_ns), op.mono_ns)
            if op.acked and op.done is not None:
                ret = op.done.mono_ns
                keys.first_ack[at] = min(keys.first_ack.get(at, ret), ret)
        for read in finals:
            assert read.done is not None
            for r in read.done.records:
                held = keys.holders.setdefault((read.tenant, r.sender, r.cmid), [])
                held.append((read.conversation, r))
        return keys

    def member(self, tenant: str, conversation: str, sender: str) -> bool:
        known = self.members.get((tenant, conversation))
        return known is None or sender in known  # no create line: everyone is

    def situation(self, op: Op) -> outcomes.Situation:
        """The situation of commit ``op`` (``outcomes``), from the final reads."""
        returned = op.done.mono_ns if op.done is not None else 1 << 62
        for _, record in self.holders.get(op.key, ()):
            if record.digest != op.digest:
                sent = self.first_call.get((op.key, record.digest))
                if sent is not None and sent < returned:
                    return "conflict"
        if not self.member(op.tenant, op.conversation, op.sender):
            return "non-member"
        acked = self.first_ack.get((op.key, op.digest))
        return "replay" if acked is not None and acked < op.mono_ns else "fresh"

    def check(self, ops: Iterable[Op]) -> list[Anomaly]:
        found: list[Anomaly] = []
        for op in ops:
            done, name = op.done, f"{op.tenant}/{op.conversation}"
            if done is None:
                continue
            if op.kind == "read" and done.outcome == "error":
                found.append(Anomaly("wrong-refusal", name, f"read refused: {done.code}"))
            if op.kind != "commit":
                continue
            situation = self.situation(op)
            if done.outcome == "ok" and situation == "non-member":
                key = (op.sender, op.cmid)
                found.append(Anomaly("non-member-acked", name, f"key {key} of a non-member"))
            elif done.outcome == "error" and not outcomes.allowed(
                situation, "error", done.code, done.reason
            ):
                what = f"{done.code} {done.reason}".strip()
                found.append(
                    Anomaly(
                        "wrong-refusal", name, f"key {(op.sender, op.cmid)} ({situation}): {what}"
                    )
                )
        return found

    def elsewhere(self, tenant: str, conversation: str, sender: str, cmid: str) -> list[str]:
        """The other conversations whose final read holds this key."""
        held = self.holders.get((tenant, sender, cmid), ())
        return sorted({c for c, _ in held if c != conversation})

    def in_two_conversations(self) -> list[Anomaly]:
        """A key recorded in more than one conversation was given to two requests."""
        found: list[Anomaly] = []
        by_key: dict[TKey, set[str]] = defaultdict(set)
        for key, held in self.holders.items():
            by_key[key].update(c for c, _ in held)
        for (tenant, sender, cmid), conversations in sorted(by_key.items()):
            if len(conversations) > 1:
                where = ", ".join(sorted(conversations))
                found.append(
                    Anomaly(
                        "duplicate-message", tenant, f"key {(sender, cmid)} recorded in {where}"
                    )
                )
        return found
