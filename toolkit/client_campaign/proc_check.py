"""The checker of the process mode: what every send a device was asked for became.

A send's identity is (user, cmid); the two devices of a user may send the same
one (the ``conflict`` action), so the server's record also names the device.

==================  ===========================================================
lost                persisted, never refused, not pending, and the server holds
                    no record of it (a reset that said ``lost_pending`` is a
                    *reported* loss instead); or a message committed while a
                    user was surely a member, missing from that user's device
duplicated          (user, cmid) held twice by the server; a message id twice in
                    a device's store, or reported new twice in one store life
                    (a life ends at a reset; a reset is said by the device at
                    open, and an incarnation that died opening a file the
                    campaign damaged ends a life too, its reset unsaid)
wrongly confirmed   a SendConfirmed whose coordinates (conversation, message
                    id, seq) differ from the server's record of that send
                    identity, or whose record is another device's or another
                    content's
wrong refusal       refused with a code its kind does not allow (a long outage
                    must never end in a refusal), refused and committed, both
                    confirmed and refused, or committed while its sender was
                    surely not a member
stuck               still pending (not parked) after the settle bound
phantom             a message id a device holds that the server does not
==================  ===========================================================

"Surely a member": at the membership version the message's delivery was frozen at
(``Ledger.frozen``, when the run knows it: the e2e nemesis reads it from the
mailbox entries), after the newest change of that user whose answer carried a
version at or below it; a change whose answer was lost leaves that user, and only
it, unjudged until a later answered change. A message of unknown version is judged
by the changes' wall-clock windows instead (the parent's clock before and after the
admin call; the server stamps records with the same machine's clock); a record
inside a window is not judged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.domain.model import MessageRecord

CLIENT_BODY_MAX = 64 * 1024
ALLOWED = {
    "nonmember": {"NotAMember"},
    "oversize": {"InvalidRequest", "RequestTooLarge"},
    "conflict": {"IdempotencyConflict"},
    "normal": set(),
}
MARGIN_S = 0.05


@dataclass
class SendAttempt:
    user: str
    device: str
    cmid: str
    conversation: str
    size: int
    kind: str
    reply: dict[str, Any] = field(default_factory=dict)
    at: int = 0
    """How many events its device had reported when it was asked for: only a reset
    after that can have lost it."""


@dataclass(frozen=True)
class Change:
    conversation: str
    user: str
    member_after: bool
    before_s: float
    after_s: float
    version: int | None = None
    """The membership version its answer carried; None when the answer was lost."""


@dataclass
class Ledger:
    initial: dict[str, set[str]]
    attempts: list[SendAttempt] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    """In the order they were made (one at a time): answered versions only grow."""
    frozen: dict[str, int] = field(default_factory=dict)
    """The membership version each message's delivery was frozen at, by message id."""

    def record(self, attempt: SendAttempt, _now_s: float) -> None:
        self.attempts.append(attempt)

    def membership(
        self,
        conversation: str,
        user: str,
        member_after: bool,
        before_s: float,
        after_s: float,
        version: int | None = None,
    ) -> None:
        change = Change(conversation, user, member_after, before_s, after_s, version)
        self.changes.append(change)

    def recipient(self, record: MessageRecord, user: str) -> bool | None:
        """Whether ``user`` surely was (not) a member for ``record``: at its frozen
        version when known (``member_at_version``), else by the windows."""
        version = self.frozen.get(record.message_id)
        if version is None:
            return self.member_at(record.conversation, user, record.server_ts_ms / 1000)
        return self.member_at_version(record.conversation, user, version)

    def member_at_version(self, conversation: str, user: str, version: int) -> bool | None:
        """True/False when surely (not) a member at membership ``version``: as the
        newest answered change of ``user`` at or below it left it (the initial
        members before any); None when a change with a lost answer came after that
        one (its version, below or above ``version``, is unknown)."""
        state: bool | None = user in self.initial.get(conversation, set())
        for c in self.changes:
            if c.conversation != conversation or c.user != user:
                continue
            if c.version is None:
                state = None
            elif c.version <= version:
                state = c.member_after
            else:
                break
        return state

    def member_at(self, conversation: str, user: str, ts_s: float) -> bool | None:
        """True/False when surely (not) a member at ``ts_s``; None inside a change."""
        state = user in self.initial.get(conversation, set())
        for c in self.changes:
            if c.conversation != conversation or c.user != user:
                continue
            if ts_s < c.before_s - MARGIN_S:
                return state
            if ts_s <= c.after_s + MARGIN_S:
                return None
            state = c.member_after
        return state

    def final_members(self, conversation: str) -> set[str]:
        members = set(self.initial.get(conversation, set()))
        for c in self.changes:
            if c.conversation == conversation:
                (members.add if c.member_after else members.discard)(c.user)
        return members

    def changed(self, conversation: str, user: str) -> bool:
        return any(c.conversation == conversation and c.user == user for c in self.changes)


class Device(Protocol):
    user: str
    device: str
    events: list[dict[str, Any]]


@dataclass
class Verdict:
    seed: int = 0
    sends: int = 0
    lost: int = 0
    reported_lost: int = 0
    duplicated: int = 0
    wrongly_confirmed: int = 0
    wrong_refusal: int = 0
    stuck: int = 0
    phantom: int = 0
    broken: bool = False
    settled_in_s: float = 0.0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    fired: dict[str, int] = field(default_factory=dict)
    scheduled: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        bad = self.lost + self.duplicated + self.wrongly_confirmed + self.wrong_refusal
        return not (bad or self.stuck or self.phantom or self.broken or self.settled_in_s < 0)

    def bad(self, kind: str, what: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.problems.append(f"{kind}: {what}")


def check(
    ledger: Ledger,
    history: dict[str, list[MessageRecord]],
    devices: list[Any],
    statuses: dict[tuple[str, str], dict[str, Any]],
) -> Verdict:
    v = Verdict()
    records: dict[tuple[str, str], list[MessageRecord]] = {}
    for conversation_records in history.values():
        for r in conversation_records:
            records.setdefault((r.sender, r.cmid), []).append(r)
            if ledger.recipient(r, r.sender) is False:
                v.bad("wrong_refusal", f"{r.cmid} committed while {r.sender} was not a member")
    for key, held in records.items():
        if len(held) > 1:
            v.bad("duplicated", f"{key[1]} is in history {len(held)} times")
    by_device = {(d.user, d.device): d for d in devices}
    twins = Counter((a.user, a.cmid) for a in ledger.attempts)
    for a in ledger.attempts:
        d = by_device[(a.user, a.device)]
        _judge(
            v,
            ledger,
            a,
            records.get((a.user, a.cmid), []),
            d,
            statuses[(a.user, a.device)],
            twins[(a.user, a.cmid)] > 1,
        )
    for d in devices:
        _judge_store(v, ledger, history, d, statuses[(d.user, d.device)])
    return v


def _judge(
    v: Verdict,
    ledger: Ledger,
    a: SendAttempt,
    held: list[MessageRecord],
    d: Any,
    status: dict[str, Any],
    has_twin: bool,
) -> None:
    reply = a.reply.get("ev", "none")
    if reply == "refused":
        error = a.reply["error"]
        local_ok = a.kind == "oversize" and a.size > CLIENT_BODY_MAX and error == "InvalidArgument"
        local_ok |= a.kind == "conflict" and error == "DuplicateClientMessageId"
        if local_ok:
            v.outcomes[f"refused {error} (not persisted)"] += 1
        else:
            v.bad("wrong_refusal", f"{a.cmid} refused before persist: {a.reply['error']}")
        return
    mine = [r for r in held if r.device == a.device and len(r.content.body) == a.size]
    confirmed = [e for e in d.events if e["ev"] == "confirmed" and e["cmid"] == a.cmid]
    failed = [e for e in d.events if e["ev"] == "failed" and e["cmid"] == a.cmid]
    v.sends += reply == "persisted"
    for e in confirmed:
        said = (e["conversation"], e["message_id"], e["seq"])
        if not mine or (mine[0].conversation, mine[0].message_id, mine[0].seq) != said:
            who = f"{a.user}/{a.device}"
            v.bad("wrongly_confirmed", f"{who} confirmed {a.cmid} as {e['message_id']}")
    if confirmed:
        v.outcomes[f"confirmed via {confirmed[0]['via']}"] += 1
    allowed = set(ALLOWED[a.kind])
    if has_twin:
        allowed.add("IdempotencyConflict")
    if ledger.changed(a.conversation, a.user):  # sent while a member, resent after
        allowed.add("NotAMember")
    for e in failed:
        v.outcomes[f"refused {e['error']}"] += 1
        if e["error"] not in allowed:
            v.bad("wrong_refusal", f"{a.cmid} ({a.kind}) refused {e['error']}")
        if mine:
            v.bad("wrong_refusal", f"{a.cmid} refused yet committed")
        if confirmed:
            v.bad("wrong_refusal", f"{a.cmid} both confirmed and refused")
    if confirmed or failed:
        if a.kind in ("nonmember", "oversize") and mine:
            v.bad("wrong_refusal", f"{a.cmid} ({a.kind}) was committed")
        return
    pending = set(status.get("pending", []))
    if a.cmid in pending:
        if a.cmid in status.get("parked", []):
            v.outcomes["refused (event died with its process)"] += 1
        else:
            v.bad("stuck", f"{a.user}/{a.device} {a.cmid} still pending")
        return
    if mine:
        v.outcomes["confirmed (event died with its process)"] += 1
        return
    if reply != "persisted":
        v.outcomes["never persisted (the device died during the call)"] += 1
        return
    if any(e["ev"] == "reset" and e["lost"] for e in d.events[a.at :]):
        v.reported_lost += 1
        return
    v.bad("lost", f"{a.user}/{a.device} {a.cmid} ({a.kind}) is nowhere")


def _judge_store(
    v: Verdict,
    ledger: Ledger,
    history: dict[str, list[MessageRecord]],
    d: Any,
    status: dict[str, Any],
) -> None:
    lives: list[Counter[str]] = [Counter()]
    damaged = ready = unsaid = False
    for e in d.events:
        if e["ev"] == "reset":
            if unsaid and e.get("at") != "open":  # kept in the new file, said by this one
                v.outcomes["store reset said by the next process (the first died opening)"] += 1
            lives.append(Counter())
            damaged = unsaid = False
        elif e["ev"] == "corrupted":
            damaged = True
        elif e["ev"] == "started":
            if damaged and not ready:  # it died opening the damaged file, before saying so
                lives.append(Counter())
                v.outcomes["store reset by a process that died opening it"] += 1
                damaged, unsaid = False, True
            ready = False
        elif e["ev"] == "ready":
            ready = True
        elif e["ev"] == "added":
            lives[-1].update(e["ids"])
        elif e["ev"] == "confirmed":
            lives[-1][e["message_id"]] += 1
    for life in lives:
        for message_id, n in life.items():
            if n > 1:
                v.bad("duplicated", f"{d.user}/{d.device} reported {message_id} {n} times")
    for conversation, ids in status.get("held", {}).items():
        server = {r.message_id for r in history.get(conversation, [])}
        for message_id, n in Counter(ids).items():
            if n > 1:
                v.bad("duplicated", f"{d.user}/{d.device} holds {message_id} {n} times")
            if message_id not in server:
                v.bad("phantom", f"{d.user}/{d.device} holds unknown {message_id}")
    for conversation, message_id in missing(ledger, history, d.user, status):
        v.bad("lost", f"{d.user}/{d.device} lacks {message_id} of {conversation}")


def missing(
    ledger: Ledger, history: dict[str, list[MessageRecord]], user: str, status: dict[str, Any]
) -> list[tuple[str, str]]:
    """Messages a device of ``user`` must hold and does not: those committed while
    the user was surely a member (``Ledger.recipient``) of a conversation it is a
    member of at the end."""
    lacking = []
    for conversation, ids in status.get("held", {}).items():
        if user not in ledger.final_members(conversation):
            continue
        mine = set(ids)
        for r in history.get(conversation, []):
            if r.message_id not in mine and ledger.recipient(r, user):
                lacking.append((conversation, r.message_id))
    return lacking
