"""Seeded fault scenarios: one seed draws a workload and a fault schedule.

``run_scenario(backend, seed)`` is deterministic in what it *asks for*: the
same seed draws the same senders, conversations, duplicates, reused keys,
crash points, failing store calls and recovery runs. It runs them against a
real backend, then recovers with faults off and checks every invariant of
DESIGN §7. A failure report names the seed, which replays it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field

from service.domain.committer import MessageCommitter
from service.domain.errors import CommitError
from service.domain.faults import FaultPoint, InjectedCrash
from service.domain.limits import CommitLimits
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from service.domain.ports import Backend, ManualClock
from toolkit.campaign.faulty import CallFault, FaultyOutbox, FaultyStore
from toolkit.campaign.invariants import Ledger, check_invariants, check_recovered

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
    ledger: Ledger
    senders: list[str]
    conversations: list[str]
    sent: list[AuthenticatedSend] = field(default_factory=list)
    fired: Counter[str] = field(default_factory=Counter)


def _content(rng: random.Random) -> MessageContent:
    if rng.random() < 0.15:
        return MessageContent(MessageType.CUSTOM, rng.randbytes(8), custom_type="card")
    return MessageContent(MessageType.TEXT, rng.randbytes(rng.randint(1, 64)))


def _new_send(w: _World) -> AuthenticatedSend:
    return AuthenticatedSend(
        tenant=w.tenant,
        sender=w.rng.choice(w.senders),
        device=w.rng.choice(["phone", "web"]),
        conversation=w.rng.choice(w.conversations),
        cmid=f"cm{w.rng.getrandbits(40):x}",
        content=_content(w.rng),
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


async def _send(w: _World, request: AuthenticatedSend) -> None:
    try:
        ack = await w.committer.commit_send(request)
    except InjectedCrash as crash:
        w.fired[f"crash {crash.point.value}"] += 1
        return
    except CommitError as exc:
        w.fired[f"error {type(exc).__name__}"] += 1
        return
    w.ledger.acked(request, ack)


async def _step(w: _World) -> None:
    roll = w.rng.random()
    if roll < 0.1:
        w.clock.advance(w.rng.randint(1, 120_000))
        workers = w.rng.randint(1, 3)
        bound = w.clock.now_ms() - 30_000
        results = await asyncio.gather(
            *(w.committer.recover_due(bound, 20) for _ in range(workers)),
            return_exceptions=True,
        )
        w.fired["recovery run"] += workers
        for result in results:
            if isinstance(result, InjectedCrash):
                w.fired[f"crash {result.point.value}"] += 1
            elif isinstance(result, BaseException) and not isinstance(result, CommitError):
                raise result
        return
    _arm_faults(w)
    if roll < 0.3:
        batch = [_pick_request(w) for _ in range(w.rng.randint(2, 5))]
        await asyncio.gather(*(_send(w, r) for r in batch))
    else:
        await _send(w, _pick_request(w))
    w.clock.advance(w.rng.randint(0, 2_000))


async def run_scenario(backend: Backend, seed: int, steps: int | None = None) -> ScenarioResult:
    """Run the scenario of ``seed`` on ``backend`` and check every invariant."""
    rng = random.Random(seed)
    clock = ManualClock()
    store, outbox = FaultyStore(backend.store), FaultyOutbox(backend.outbox)
    committer = MessageCommitter(
        store,
        backend.membership,
        outbox,
        limits=CommitLimits(sender_rate_per_s=0),
        clock=clock,
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
        ledger=Ledger(),
        senders=[f"u{i}" for i in range(rng.randint(2, 4))],
        conversations=[f"c{i}" for i in range(rng.randint(1, 3))],
    )
    for conv in w.conversations:
        await backend.membership.create_conversation(tenant, conv, [*w.senders, "reader"])
        w.ledger.conversation(tenant, conv, "reader")
    for _ in range(steps if steps is not None else rng.randint(10, 40)):
        await _step(w)
    committer.faults.disarm_all()
    store.faults.clear()
    outbox.faults.clear()
    clock.advance(3_600_000)
    bound = clock.now_ms()
    for _ in range(MAX_RECOVERY_ROUNDS):
        if not await committer.recover_due(bound, 100):
            break
    for request in w.sent:  # every client retries once more after recovery
        await _send(w, request)
    violations = await check_recovered(backend, bound)
    violations += await check_invariants(backend, w.ledger)
    fired = Counter(w.fired)
    for (operation, fault), n in (store.faults.fired + outbox.faults.fired).items():
        fired[f"call {operation} {fault.value}"] += n
    acks = sum(len(a) for a in w.ledger.acks.values())
    return ScenarioResult(seed, [f"seed {seed}: {v}" for v in violations], acks, fired)
