"""Seeded fault scenarios: one seed draws a workload and a fault schedule.

``run_scenario(backend, seed, clock=...)`` is deterministic in what it *asks
for*: the same seed draws the same senders, conversations, duplicates, reused
keys, crash points, failing store calls, recovery runs and bad-day events. It
runs them against a real backend whose time follows ``clock`` (the scenario
moves it), then recovers with faults off and checks every invariant of
DESIGN §7. A failure report names the seed, which replays it.

Bad days (DESIGN §12, issue "bad days"):

* **poison**: a key's stored intent turns undecodable (``FaultyStore.poison``):
  recovery must quarantine it, never ACK it, and never stop for it; every
  other intent still commits; after the operator heals and retries it, it
  commits like the rest;
* **clock skew**: a second replica whose clock is days off sends and retries
  through the same backend; the original ACKs must survive (the backend
  decides time, not a replica);
* **retention race**: time jumps past history retention while intents are
  unfinished and history is read (which trims); they must still commit, with
  their records;
* **eviction / lost identity** (backends that have them, through
  ``BackendFaults``): an evicting memory policy and a lost deployment identity
  must each make readiness fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from service.domain.committer import MessageCommitter
from service.domain.errors import CommitError, NotAMember, StoreError
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.ids import CommitKey
from service.domain.limits import CommitLimits
from service.domain.model import (
    AuthenticatedSend,
    Committed,
    HistoryQuery,
    MessageContent,
    MessageType,
)
from service.domain.ports import Backend, Clock, ManualClock, StoreSettings
from toolkit.campaign.faulty import CallFault, FaultyOutbox, FaultyStore
from toolkit.campaign.invariants import Ledger, Retention, check_invariants, check_recovered

STORE_OPS = (
    "reserve",
    "put_record",
    "mark_outbox_published",
    "mark_published_and_committed",
    "mark_committed",
    "load_commit",
    "load_commit_for_request",
)
MAX_RECOVERY_ROUNDS = 50
DAY_MS = 86_400_000


class BackendFaults(Protocol):
    """Faults of the backend itself (a real server's settings and data)."""

    async def evicting(self, on: bool) -> None:
        """Switch the server to an evicting memory policy (or back)."""

    async def identity_lost(self, on: bool) -> None:
        """Make the server lose (or get back) the deployment's identity."""


@dataclass
class OffsetClock:
    """A replica's clock: another clock plus a fixed offset."""

    base: Clock
    offset_ms: int

    def now_ms(self) -> int:
        return self.base.now_ms() + self.offset_ms


@dataclass
class ScenarioResult:
    """What one seed did and what it found."""

    seed: int
    violations: list[str]
    acks: int = 0
    fired: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class _World:
    rng: random.Random
    tenant: str
    clock: ManualClock
    backend: Backend
    store: FaultyStore
    outbox: FaultyOutbox
    committer: MessageCommitter
    skewed: MessageCommitter
    ledger: Ledger
    senders: list[str]
    conversations: list[str]
    faults: BackendFaults | None
    sent: list[AuthenticatedSend] = field(default_factory=list)
    fired: Counter[str] = field(default_factory=Counter)
    poisoned_at: dict[CommitKey, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def _content(rng: random.Random) -> MessageContent:
    if rng.random() < 0.15:
        return MessageContent(MessageType.CUSTOM, rng.randbytes(8), custom_type="card")
    return MessageContent(MessageType.TEXT, rng.randbytes(rng.randint(1, 64)))


def _new_send(w: _World) -> AuthenticatedSend:
    mentions = tuple(w.rng.sample(w.senders, 1)) if w.rng.random() < 0.2 else ()
    return AuthenticatedSend(
        tenant=w.tenant,
        sender=w.rng.choice(w.senders),
        device=w.rng.choice(["phone", "web"]),
        conversation=w.rng.choice(w.conversations),
        cmid=f"cm{w.rng.getrandbits(40):x}",
        content=_content(w.rng),
        mentions=mentions,
    )


def _pick_request(w: _World) -> AuthenticatedSend:
    roll = w.rng.random()
    if w.sent and roll < 0.3:
        return w.rng.choice(w.sent)  # a retry of an earlier send
    if w.sent and roll < 0.4:  # the same key, another message: must never be ACKed
        return dataclasses.replace(w.rng.choice(w.sent), content=_content(w.rng))
    request = _new_send(w)
    w.sent.append(request)
    return request


def _arm_faults(w: _World) -> None:
    roll = w.rng.random()
    if roll < 0.25:
        w.committer.faults.arm(w.rng.choice(list(FaultPoint)))
    elif roll < 0.45:
        w.store.inject(w.rng.choice(STORE_OPS), w.rng.choice(list(CallFault)))
    elif roll < 0.55:
        w.outbox.inject("publish", w.rng.choice([CallFault.FAIL, CallFault.LOSE_REPLY]))
    elif roll < 0.6 and w.sent:
        key = w.rng.choice(w.sent).key
        if key not in w.poisoned_at:
            w.store.poison(key)
            w.poisoned_at[key] = sum(len(a) for a in w.ledger.acks.values())
            w.fired["bad day: poison intent"] += 1


async def _send(w: _World, request: AuthenticatedSend) -> None:
    via_skewed = w.rng.random() < 0.2
    committer = w.skewed if via_skewed else w.committer
    w.ledger.attempted(request, w.clock.now_ms())
    try:
        ack = await committer.commit_send(request)
    except InjectedCrash as crash:
        w.fired[f"crash {crash.point.value}"] += 1
        return
    except CommitError as exc:
        w.fired[f"error {type(exc).__name__}"] += 1
        return
    if via_skewed:
        w.fired["bad day: send via a skewed replica"] += 1
    if request.key in w.store.poisoned:
        w.violations.append(f"poison: {request.key} was ACKed while undecodable")
    durable = await w.backend.store.load_commit(request.key, request.conversation)
    if durable != Committed(ack):  # an ACK is made only of a COMMITTED intent, at once
        w.violations.append(f"0: {request.key} was ACKed but is not committed: {durable}")
    w.ledger.acked(request, ack)


async def _recover(w: _World, committer: MessageCommitter, bound: int) -> int:
    report = await committer.recover_due(bound, 20)
    w.fired["quarantined"] += report.quarantined
    return report.scanned


async def _step(w: _World) -> None:
    roll = w.rng.random()
    if roll < 0.1:
        w.clock.advance(w.rng.randint(1, 120_000))
        workers = w.rng.randint(1, 3)
        bound = w.clock.now_ms() - 30_000
        results = await asyncio.gather(
            *(_recover(w, w.committer, bound) for _ in range(workers)),
            return_exceptions=True,
        )
        w.fired["recovery run"] += workers
        for result in results:
            if isinstance(result, InjectedCrash):
                w.fired[f"crash {result.point.value}"] += 1
            elif isinstance(result, BaseException) and not isinstance(result, CommitError):
                raise result
        return
    if roll < 0.13 and w.faults is not None:
        await _backend_fault(w)
        return
    if roll < 0.15:
        await _outsider_reads(w)
        return
    _arm_faults(w)
    if roll < 0.3:
        batch = [_pick_request(w) for _ in range(w.rng.randint(2, 5))]
        await asyncio.gather(*(_send(w, r) for r in batch))
    else:
        await _send(w, _pick_request(w))
    w.clock.advance(w.rng.randint(0, 2_000))


async def _outsider_reads(w: _World) -> None:
    """A user who is not a member must never read a conversation's history."""
    conversation = w.rng.choice(w.conversations)
    try:
        await w.committer.history(HistoryQuery(w.tenant, conversation, "outsider"))
    except NotAMember:
        w.fired["check: an outsider's history read refused"] += 1
        return
    except CommitError:
        return  # an injected fault got there first
    w.violations.append(f"authorisation: an outsider read {w.tenant}/{conversation}")


async def _backend_fault(w: _World) -> None:
    """Evict or lose the identity; readiness must refuse while it lasts."""
    assert w.faults is not None
    evict = w.rng.random() < 0.5
    kind = "eviction policy" if evict else "lost deployment identity"
    toggle = w.faults.evicting if evict else w.faults.identity_lost
    await toggle(True)
    try:
        await w.backend.store.readiness()
        w.violations.append(f"{kind}: readiness passed")
    except StoreError:
        w.fired[f"bad day: {kind} refused"] += 1
    finally:
        await toggle(False)


async def _drain(w: _World, bound: int) -> None:
    for _ in range(MAX_RECOVERY_ROUNDS):
        report = await w.committer.recover_due(bound, 100)
        w.fired["quarantined"] += report.quarantined
        if report.scanned < 100:
            return


async def _finish(w: _World, retention_ms: int, window_ms: int) -> list[str]:
    """Heal, check poison handling, recover, retry everything once, check."""
    w.committer.faults.disarm_all()
    w.skewed.faults.disarm_all()
    w.store.faults.clear()
    w.outbox.faults.clear()
    acked_before_jump = set(w.ledger.acks)
    if w.rng.random() < 0.3:  # the retention race
        w.clock.advance(retention_ms + DAY_MS)
        for conv in w.conversations:
            await w.backend.store.history_page(HistoryQuery(w.tenant, conv, "reader"))
        w.fired["bad day: retention passed unfinished intents"] += 1
    else:
        acked_before_jump = set()
        w.clock.advance(3_600_000)
    bound = w.clock.now_ms()
    await _drain(w, bound)
    for key in w.poisoned_at:  # every unfinished poisoned intent is quarantined, not lost
        item = await w.backend.store.recovery_item(key)
        if item is not None and not item.quarantined:
            w.violations.append(f"poison: {key} unfinished but not quarantined")
    w.store.heal()
    page = await w.committer.quarantined("", 1000)
    for item in (i for i in page.items if i.key.tenant == w.tenant):  # the operator retries each
        w.fired["operator retried a quarantined intent"] += 1
        try:
            await w.committer.retry_quarantined(item.key)
        except CommitError:
            w.fired["error retrying a quarantined intent"] += 1
    await _drain(w, bound)
    violations = await check_recovered(w.backend, bound, w.ledger)  # recovery alone did it
    for request in w.sent:  # every client retries once more after recovery
        if request.key not in acked_before_jump:  # past the window a key is new again
            await _send(w, request)
    retention = Retention(w.clock.now_ms(), retention_ms, window_ms)
    violations += await check_invariants(w.backend, w.ledger, retention)
    return violations + w.violations


async def run_scenario(
    backend: Backend,
    seed: int,
    steps: int | None = None,
    *,
    clock: ManualClock | None = None,
    settings: StoreSettings | None = None,
    faults: BackendFaults | None = None,
) -> ScenarioResult:
    """Run the scenario of ``seed`` on ``backend`` and check every invariant.

    ``clock`` must be the clock the backend decides time by (memory's clock,
    Redis's test time shift); the scenario resets it to wall time and moves it.
    """
    rng = random.Random(seed)
    clock = clock if clock is not None else ManualClock()
    clock.now = ManualClock().now
    store, outbox = FaultyStore(backend.store), FaultyOutbox(backend.outbox)
    limits = CommitLimits(sender_rate_per_s=0)
    committer = MessageCommitter(store, backend.membership, outbox, limits=limits, clock=clock)
    offset = rng.choice([-1, 1]) * rng.randint(1, 3) * DAY_MS
    skewed = MessageCommitter(
        store, backend.membership, outbox, limits=limits, clock=OffsetClock(clock, offset)
    )
    tenant = f"fc{seed}-{uuid.uuid4().hex[:8]}"  # fresh ids on shared backends
    w = _World(
        rng=rng,
        tenant=tenant,
        clock=clock,
        backend=backend,
        store=store,
        outbox=outbox,
        committer=committer,
        skewed=skewed,
        ledger=Ledger(),
        senders=[f"u{i}" for i in range(rng.randint(2, 4))],
        conversations=[f"c{i}" for i in range(rng.randint(1, 3))],
        faults=faults,
    )
    for conv in w.conversations:
        await backend.membership.create_conversation(tenant, conv, [*w.senders, "reader"])
        w.ledger.conversation(tenant, conv, "reader")
    for _ in range(steps if steps is not None else rng.randint(10, 40)):
        await _step(w)
    chosen = settings or StoreSettings()
    violations = await _finish(w, chosen.history_retention_ms, chosen.idempotency_window_ms)
    fired = Counter(w.fired)
    for (operation, fault), n in (store.faults.fired + outbox.faults.fired).items():
        fired[f"call {operation} {fault.value}"] += n
    for steps, n in store.pipelined.items():
        fired[f"pipelined commit, {steps} of 3 steps"] += n
    acks = sum(len(a) for a in w.ledger.acks.values())
    return ScenarioResult(seed, [f"seed {seed}: {v}" for v in violations], acks, fired)
