"""Redis against the memory backend, step by step: the same calls, the same answers.

The memory backend is the behavioural spec. Seeded random sequences of
store calls (reserve, every transition with right and wrong inputs, loads,
history pages, recovery scans, membership changes, and clock jumps past the
idempotency window and the history retention) run on both; every result or
error type must be equal.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from backends.memory import open_memory_backend
from service.domain.errors import StoreError
from service.domain.model import (
    AuthenticatedSend,
    CommitIntent,
    CommitState,
    Direction,
    FrozenDeliveryInput,
    HistoryQuery,
    InProgress,
    OutboxPublication,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend, ManualClock, StoreSettings
from tests.servers.redis_server import RedisHarness
from tests.support import referenced, send, text

pytestmark = pytest.mark.redis

SETTINGS = StoreSettings(idempotency_window_ms=1_000, history_retention_ms=3_000)
STEPS = 120
PUBLICATIONS = (OutboxPublication("s", "1-0"), OutboxPublication("s", "2-0"))


async def _both(
    call: Callable[[Backend], Awaitable[Any]], memory: Backend, redis: Backend
) -> tuple[Any, Any]:
    results = []
    for backend in (memory, redis):
        try:
            results.append(("ok", await call(backend)))
        except StoreError as exc:
            results.append(("error", type(exc).__name__))
    return results[0], results[1]


async def _scan(backend: Backend, older_than_ms: int) -> list[CommitIntent]:
    """Recovery candidates, oldest first; equally old ones in key order (memory
    keeps reserve order among them, Redis the recovery index's member order)."""
    found = await backend.store.scan_recoverable_commits(older_than_ms, 10)
    intents = [i.intent for i in found if i.intent is not None]
    return sorted(intents, key=lambda i: (i.created_at_ms, i.key.cmid))


def _request(rng: random.Random, tenant: str, cmid: str) -> AuthenticatedSend:
    conv = rng.choice(["c1", "c1", "c2"])
    content = rng.choice([text("a"), text("b"), referenced()])
    return send(tenant, conv, cmid=cmid, content=content, mentions=rng.choice([(), ("bob",)]))


Call = Callable[[Backend], Awaitable[Any]]


class _Walk:
    """One seeded random walk over a few keys of one tenant."""

    def __init__(self, seed: int, clocks: tuple[ManualClock, ManualClock]) -> None:
        self.rng = random.Random(seed)
        self.tenant = f"t{seed}"
        self.clocks = clocks
        self.intents: dict[str, CommitIntent] = {}
        self.requests: dict[str, AuthenticatedSend] = {}
        self.delivery = FrozenDeliveryInput(("alice", "bob"), 1)

    def reserve(self, cmid: str, step: int) -> tuple[Call, AuthenticatedSend]:
        known = self.requests.get(cmid)
        req = known if known and self.rng.random() < 0.7 else None
        req = req or _request(self.rng, self.tenant, cmid)
        candidate, delivery = ReserveCandidate(f"m-{step}", step), self.delivery

        def call(b: Backend) -> Awaitable[Any]:
            return b.store.reserve(req, delivery, candidate)

        return call, req

    def transition(self, op: str, intent: CommitIntent) -> Call:
        pub = self.rng.choice(PUBLICATIONS)
        if op == "forge":
            intent = dataclasses.replace(
                intent, record=dataclasses.replace(intent.record, device="other")
            )
            op = self.rng.choice(["put", "publish", "pub_commit", "commit"])

        def call(b: Backend) -> Awaitable[Any]:
            if op == "put":
                return b.store.put_record(intent)
            if op == "publish":
                return b.store.mark_outbox_published(intent, pub)
            if op == "pub_commit":
                return b.store.mark_published_and_committed(intent, pub)
            return b.store.mark_committed(intent)

        return call

    def read(self, op: str, cmid: str) -> Call | None:
        rng, intent, request = self.rng, self.intents.get(cmid), self.requests.get(cmid)
        if op == "load" and intent is not None:
            key, conv = intent.key, rng.choice([intent.conversation, "c2"])
            return lambda b: b.store.load_commit(key, conv)
        if op == "load_req" and request is not None:
            return lambda b: b.store.load_commit_for_request(request)
        if op == "history":
            query = HistoryQuery(
                self.tenant,
                rng.choice(["c1", "c2", "nope"]),
                rng.choice(["alice", "bob", "eve"]),
                rng.choice(list(Direction)),
                rng.randrange(0, 8),
                rng.randrange(1, 5),
                rng.choice([1024, 1 << 20]),
            )
            return lambda b: b.store.history_page(query)
        if op == "scan":
            bound = self.clocks[0].now_ms() + rng.randrange(-500, 500)
            return lambda b: _scan(b, bound)
        if op == "members":
            users = rng.sample(["alice", "bob", "eve"], 2)
            add = rng.random() < 0.5
            tenant = self.tenant

            def members(b: Backend) -> Awaitable[Any]:
                if add:
                    return b.membership.add_members(tenant, "c1", users)
                return b.membership.remove_members(tenant, "c1", users)

            return members
        return None

    def tick(self) -> None:
        jump = self.rng.choice([100, 600, 1_100, 3_100])
        for clock in self.clocks:
            clock.advance(jump)


def _create(tenant: str, conversation: str) -> Call:
    return lambda b: b.membership.create_conversation(tenant, conversation, ["alice", "bob"])


@pytest.mark.parametrize("seed", range(40))
async def test_redis_answers_every_call_as_memory_does(redis_h: RedisHarness, seed: int) -> None:
    clocks = (ManualClock(1_000_000), ManualClock(1_000_000))
    memory = open_memory_backend(settings=SETTINGS, clock=clocks[0])
    redis = await redis_h.open(settings=SETTINGS, clock=clocks[1])
    walk = _Walk(seed, clocks)
    for conv in ("c1", "c2"):
        created = await _both(_create(walk.tenant, conv), memory, redis)
        assert created[0] == created[1]
    log: list[str] = []
    for step in range(STEPS):
        cmid = f"k{walk.rng.randrange(4)}"
        op = walk.rng.choice(
            ["reserve"] * 4
            + ["put", "publish", "pub_commit", "commit"] * 2
            + ["forge", "load", "load_req", "history", "scan", "members", "tick"]
        )
        log.append(f"{step}:{op}:{cmid}")
        intent = walk.intents.get(cmid)
        req: AuthenticatedSend | None = None
        call: Call | None
        if op == "tick":
            walk.tick()
            continue
        if op == "reserve":
            call, req = walk.reserve(cmid, step)
        elif op in ("put", "publish", "pub_commit", "commit", "forge"):
            call = None if intent is None else walk.transition(op, intent)
        else:
            call = walk.read(op, cmid)
        if call is None:
            continue
        got_m, got_r = await _both(call, memory, redis)
        assert got_r == got_m, f"seed {seed}, steps {log[-8:]}"
        kind, value = got_m
        if kind != "ok":
            continue
        if op in ("reserve", "load", "load_req") and isinstance(value, Reserved | InProgress):
            walk.intents[cmid] = value.intent
            if req is not None:
                walk.requests[cmid] = req
        elif op == "put" and intent is not None and intent.state is CommitState.RESERVED:
            walk.intents[cmid] = intent.advanced(CommitState.RECORDED)
