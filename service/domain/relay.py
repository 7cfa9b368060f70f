"""The outbox relay's rules: entry states, leases, fencing tokens, retries (seed 004).

Every outbox entry a relay handles walks this state machine::

    pending ──▶ sending ──▶ sent
       │           │ ▲
       │           │ └──────────┐
       ▼           ▼            │
    retryable ◀────┘  ──▶ sending (again)
                   │
                   ▼
              dead_letter

=============  ===============================  ==============================
from           to                               when
=============  ===============================  ==============================
pending        sending                          a relay claimed it under a lease
pending        retryable                        its delivery could not even be
                                                prepared (nothing was written)
retryable      sending                          its backoff passed, or a new
                                                lease holder took it over
sending        sent                             every mailbox write it caused is
                                                durable (only then is its
                                                outbox position acknowledged)
sending        retryable                        a write failed or its outcome is
                                                unknown: tried again later
sending        dead_letter                      it can never be delivered, or
                                                failed ``max_attempts`` times
=============  ===============================  ==============================

Anything else is ``IllegalTransition``: never silently normalised.

A relay works a *partition* of the outbox under a *lease*; each claim of a
partition by a new holder increments the partition's *fencing token*. Only
the holder of the latest token may settle entries (the outbox refuses with
LeaseLost), and every mailbox write carries the token (a mailbox refuses one
older than it has already seen, StoreFenced). A lease that expired is
reconciled first by its next holder: for each entry the old holder left
unsettled, did its mailbox writes happen? All present: accepted, confirm
(sent). Some missing: rejected, write them again (retry). The check failed:
unknown, which is never taken for success.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from service.domain.errors import IllegalTransition
from service.domain.model import OutboxEntry


class EntryState(enum.StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    RETRYABLE = "retryable"
    DEAD_LETTER = "dead_letter"


TRANSITIONS: dict[EntryState, frozenset[EntryState]] = {
    EntryState.PENDING: frozenset({EntryState.SENDING, EntryState.RETRYABLE}),
    EntryState.RETRYABLE: frozenset({EntryState.SENDING}),
    EntryState.SENDING: frozenset({EntryState.SENT, EntryState.RETRYABLE, EntryState.DEAD_LETTER}),
    EntryState.SENT: frozenset(),
    EntryState.DEAD_LETTER: frozenset(),
}


def transition(current: EntryState, target: EntryState) -> EntryState:
    """``target`` when the state machine allows ``current -> target``, else raise."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"an outbox entry cannot go from {current} to {target}")
    return target


class Verdict(enum.StrEnum):
    """What reconciling one unsettled entry found."""

    ACCEPTED = "accepted"
    """Every mailbox write it causes is there: confirm it (sent)."""
    REJECTED = "rejected"
    """Some are missing: write them again (retry)."""
    UNKNOWN = "unknown"
    """The check itself failed: never success, try again later."""


def verdict(expected: Iterable[Hashable], present: Iterable[Hashable] | None) -> Verdict:
    """The verdict for one entry's target mailboxes: ``present`` is the set of
    mailboxes found holding the message, None when the check failed."""
    if present is None:
        return Verdict.UNKNOWN
    found = set(present)
    return Verdict.ACCEPTED if all(m in found for m in expected) else Verdict.REJECTED


@dataclass(frozen=True, slots=True)
class Fence:
    """What a mailbox write carries: the partition and the writer's token."""

    partition: str
    token: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A relay's claim on one outbox partition until ``expires_at_ms``
    (the backend's clock)."""

    partition: str
    owner: str
    token: int
    expires_at_ms: int
    taken_over: bool = False
    """True when this claim started a new token (the partition had another
    holder, or none): the unsettled entries must be reconciled first."""

    @property
    def fence(self) -> Fence:
        return Fence(self.partition, self.token)


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    """An outbox entry as a relay holds it: the entry and its failed attempts so far."""

    entry: OutboxEntry
    attempts: int = 0

    @property
    def position(self) -> str:
        return self.entry.publication.position


@dataclass(frozen=True, slots=True)
class RetryMark:
    """sending -> retryable: attempts so far, when to try again, why it failed."""

    position: str
    attempts: int
    due_ms: int
    problem: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """sending -> dead_letter: the entry, why, and its attempts."""

    entry: OutboxEntry
    problem: str
    attempts: int = 0
    letter: str = ""
    """Its id in the partition's dead-letter list (set when read back)."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """What one settle records for a lease's entries (all in one backend step)."""

    sent: tuple[str, ...] = ()
    retry: tuple[RetryMark, ...] = ()
    dead: tuple[DeadLetter, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.sent or self.retry or self.dead)


@dataclass(frozen=True, slots=True)
class RelayPolicy:
    """How a relay batches, leases and retries."""

    batch: int = 100
    """Outbox entries claimed (and fanned out together) per step."""
    lease_ms: int = 10_000
    """How long a partition lease lasts without renewal; renewed every third of it."""
    fanout_threshold: int = 1000
    """Conversations with more members than this are not fanned out: they get a
    lane of their own (``conversation:<id>``) that members read."""
    max_attempts: int = 10
    """Failed attempts after which an entry is dead-lettered."""
    first_retry_ms: int = 1000
    max_retry_ms: int = 60_000

    def retry_delay_ms(self, attempts: int) -> int:
        """Backoff after the ``attempts``-th failure: doubling, capped."""
        doubled: int = self.first_retry_ms << min(30, max(0, attempts - 1))
        return min(self.max_retry_ms, doubled)

    def validate(self) -> RelayPolicy:
        if self.batch < 1 or self.batch > 1000:
            raise ValueError("the relay batch must be 1 to 1000 entries")
        if self.lease_ms < 1000 or self.fanout_threshold < 1 or self.max_attempts < 1:
            raise ValueError("lease (>= 1s), fan-out threshold and attempts must be positive")
        if self.first_retry_ms <= 0 or self.max_retry_ms < self.first_retry_ms:
            raise ValueError("retry delays must be positive, the longest at least the first")
        return self


@dataclass
class Tracker:
    """The states of the entries one relay holds for one lease, checked on every move."""

    states: dict[str, EntryState] = field(default_factory=dict)

    def move(self, positions: Sequence[str], target: EntryState) -> None:
        for position in positions:
            current = self.states.get(position, EntryState.PENDING)
            self.states[position] = transition(current, target)
            if target in (EntryState.SENT, EntryState.DEAD_LETTER):
                del self.states[position]
