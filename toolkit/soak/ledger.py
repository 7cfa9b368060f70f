"""What the soak sent and what its readers saw, and the check of one against the other.

Pure data and rules (no I/O), so the checker can be tested with a broken history.

* ``Ledger``: every send by key ``(conversation, sender, cmid)`` and its outcome: the
  message id of its ACK, or none (the outcome stayed unknown), and the conversations
  with their (static) members and whether they use their own lane.
* ``Observations``: every entry a reader saw, as ``(mailbox, epoch, seq) -> message``.
  A seq that shows another message than before in the same epoch is a *reused seq*
  (the client-visible violation), recorded the moment it is seen.
* ``check``: every ACKed message (by its ACKed id) in every intended mailbox, once per
  epoch it shows in (missing: in none, unless a reader met a new epoch of the mailbox
  after the ACK, whose rebuild reads History; duplicate: twice in one epoch); nothing
  in a mailbox that was never sent, is not addressed to it, or carries another id than
  its ACK (a message whose commit a failover lost is allowed in an epoch the lane has
  left since: the clients rebuilt from History, which does not hold it); an unknown
  send at most once per epoch; plus the reused seqs.

A mailbox is ``inbox:<user>`` or ``conversation:<id>`` (a big conversation's lane, the
same whichever member reads it). Who gets a message follows the relay
(``service/domain/targets.py``): every member of the conversation at commit, the sender
included, in their inboxes; or one entry in the conversation's own lane when it has more
members than the fan-out threshold. A lane that starts a new epoch (a rebuild) holds only
what was written after it; the client rebuilds the rest from History, so an entry seen in
any epoch of the mailbox counts as delivered.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

NOT_ADDRESSED = "not addressed to this mailbox"
Key = tuple[str, str, str]
"""(conversation, sender, cmid)"""


@dataclass(frozen=True, slots=True)
class Seen:
    """One entry a reader saw."""

    key: Key
    message_id: str


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    members: frozenset[str]
    own_lane: bool

    def mailboxes(self) -> tuple[str, ...]:
        if self.own_lane:
            return (f"conversation:{self.name}",)
        return tuple(f"inbox:{user}" for user in sorted(self.members))


@dataclass
class Ledger:
    conversations: dict[str, Conversation] = field(default_factory=dict)
    acked: dict[Key, str] = field(default_factory=dict)
    """key -> message id of its ACK"""
    unknown: set[Key] = field(default_factory=set)
    """keys whose outcome stayed unknown (never ACKed)"""
    acked_at: dict[Key, float] = field(default_factory=dict)
    """key -> when its ACK came (the run's monotonic clock)"""

    def add_conversation(self, name: str, members: frozenset[str], threshold: int) -> None:
        self.conversations[name] = Conversation(name, members, len(members) > threshold)

    def ack(self, key: Key, message_id: str, at: float = 0.0) -> None:
        self.acked[key] = message_id
        self.acked_at[key] = at
        self.unknown.discard(key)

    def lost_track(self, key: Key) -> None:
        if key not in self.acked:
            self.unknown.add(key)


@dataclass
class Observations:
    slots: dict[tuple[str, int, int], Seen] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    first_seen: dict[tuple[str, int], float] = field(default_factory=dict)
    """(mailbox, epoch) -> when a reader first saw it: its CURSOR_EXPIRED and rebuild"""
    entries: int = 0
    """Entries read (re-reads included)."""

    def see(self, mailbox: str, epoch: int, seq: int, seen: Seen, at: float = 0.0) -> None:
        self.entries += 1
        self.first_seen.setdefault((mailbox, epoch), at)
        slot = (mailbox, epoch, seq)
        before = self.slots.setdefault(slot, seen)
        if before.message_id != seen.message_id:
            self.reused.append(
                f"reused seq: {mailbox} epoch {epoch} seq {seq} showed {before.message_id}"
                f" and later {seen.message_id}"
            )
            self.slots[slot] = seen

    def epochs(self) -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for mailbox, epoch, _ in self.slots:
            found.setdefault(mailbox, set()).add(epoch)
        return found


@dataclass
class Findings:
    checked: int = 0
    """(ACKed message, intended mailbox) pairs checked."""
    missing: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)
    """never sent, not addressed to the mailbox, or another id than the ACK's"""
    healed: list[str] = field(default_factory=list)
    """never sent or another id, but in an epoch the lane left since: a failover lost
    the commit and the lane, clients got CURSOR_EXPIRED and rebuilt from History"""
    reused: list[str] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)
    """ACKed, in no epoch a reader saw, but a reader met a new epoch of the mailbox after
    the ACK: its CURSOR_EXPIRED rebuild read History, which holds the message"""

    @property
    def violations(self) -> list[str]:
        return [*self.missing, *self.duplicates, *self.stray, *self.reused]


def check(ledger: Ledger, observations: Observations) -> Findings:
    found = Findings(reused=list(observations.reused))
    # (mailbox, epoch) -> how often each key shows, and the keys per mailbox
    per_epoch: dict[tuple[str, int], Counter[tuple[Key, str]]] = {}
    in_mailbox: dict[str, set[tuple[Key, str]]] = {}
    latest = {mailbox: max(epochs) for mailbox, epochs in observations.epochs().items()}
    for (mailbox, epoch, seq), seen in sorted(observations.slots.items()):
        per_epoch.setdefault((mailbox, epoch), Counter())[(seen.key, seen.message_id)] += 1
        in_mailbox.setdefault(mailbox, set()).add((seen.key, seen.message_id))
        problem = _stray(ledger, mailbox, seen)
        if problem:
            text = f"{problem}: {mailbox} epoch {epoch} seq {seq} {seen.message_id}"
            superseded = epoch < latest[mailbox] and problem != NOT_ADDRESSED
            (found.healed if superseded else found.stray).append(text)
    for (mailbox, epoch), counts in sorted(per_epoch.items()):
        for (key, message_id), n in sorted(counts.items()):
            if n > 1:
                found.duplicates.append(
                    f"duplicate: {mailbox} epoch {epoch} holds {_name(key)} ({message_id})"
                    f" {n} times"
                )
    for key in sorted(ledger.acked):
        conversation = ledger.conversations.get(key[0])
        if conversation is None:
            continue
        for mailbox in conversation.mailboxes():
            found.checked += 1
            if (key, ledger.acked[key]) in in_mailbox.get(mailbox, set()):
                continue
            text = f"missing: {_name(key)} ({ledger.acked[key]}) in {mailbox}"
            rebuilt = [e for (m, e), at in observations.first_seen.items()
                       if m == mailbox and at > ledger.acked_at.get(key, 0.0)]  # fmt: skip
            if rebuilt:  # the readers rebuilt from History after the ACK: it has it
                found.rebuilt.append(f"{text} (rebuilt at epoch {min(rebuilt)})")
            else:
                found.missing.append(text)
    return found


def _stray(ledger: Ledger, mailbox: str, seen: Seen) -> str:
    key = seen.key
    conversation = ledger.conversations.get(key[0])
    if conversation is None or (key not in ledger.acked and key not in ledger.unknown):
        return "never sent"
    if mailbox not in conversation.mailboxes():
        return NOT_ADDRESSED
    acked = ledger.acked.get(key)
    if acked is not None and acked != seen.message_id:
        return f"another message id than its ACK's {acked}"
    return ""


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


def from_saved(saved: dict[str, Any], threshold: int) -> tuple[Ledger, Observations]:
    """The ledger and observations a run saved (``delivery-soak --keep-dir``)."""
    ledger = Ledger()
    for name, members in saved["conversations"].items():
        ledger.add_conversation(name, frozenset(members), threshold)
    for conversation, sender, cmid, message_id, *at in saved["acked"]:
        ledger.ack((conversation, sender, cmid), message_id, *at)
    for conversation, sender, cmid in saved["unknown"]:
        ledger.lost_track((conversation, sender, cmid))
    observations = Observations(reused=list(saved["reused"]))
    for mailbox, epoch, seq, conversation, sender, cmid, message_id in saved["slots"]:
        observations.slots[(mailbox, epoch, seq)] = Seen((conversation, sender, cmid), message_id)
    for mailbox, epoch, at in saved.get("first_seen", ()):
        observations.first_seen[(mailbox, epoch)] = at
    return ledger, observations
