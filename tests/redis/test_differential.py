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
    return sorted(found, key=lambda i: (i.created_at_ms, i.key.cmid))


def _request(rng: random.Random, tenant: str, cmid: str) -> AuthenticatedSend:
    conv = rng.choice(["c1", "c1", "c2"])
    content = rng.choice([text("a"), text("b"), referenced()])
    return send(tenant, conv, cmid=cmid, content=content, mentions=rng.choice([(), ("bob",)]))


@pytest.mark.parametrize("seed", range(40))
async def test_redis_answers_every_call_as_memory_does(redis_h: RedisHarness, seed: int) -> None:
    rng = random.Random(seed)
    clock_m, clock_r = ManualClock(1_000_000), ManualClock(1_000_000)
    memory = open_memory_backend(settings=SETTINGS, clock=clock_m)
    redis = await redis_h.open(settings=SETTINGS, clock=clock_r)
    tenant = f"t{seed}"
    for conv in ("c1", "c2"):
        created = await _both(
            lambda b, c=conv: b.membership.create_conversation(tenant, c, ["alice", "bob"]),
            memory,
            redis,
        )
        assert created[0] == created[1]
    intents: dict[str, CommitIntent] = {}
    requests: dict[str, AuthenticatedSend] = {}
    delivery = FrozenDeliveryInput(("alice", "bob"), 1)
    log: list[str] = []
    for step in range(STEPS):
        cmid = f"k{rng.randrange(4)}"
        op = rng.choice(
            ["reserve"] * 4
            + ["put", "publish", "pub_commit", "commit"] * 2
            + ["forge", "load", "load_req", "history", "scan", "members", "tick"]
        )
        log.append(f"{step}:{op}:{cmid}")
        intent = intents.get(cmid)
        call: Callable[[Backend], Awaitable[Any]]
        if op == "reserve":
            req = requests[cmid] if cmid in requests and rng.random() < 0.7 else None
            req = req or _request(rng, tenant, cmid)
            candidate = ReserveCandidate(f"m-{step}", step)
            call = lambda b, r=req, c=candidate: b.store.reserve(r, delivery, c)  # noqa: E731
        elif op in ("put", "publish", "pub_commit", "commit", "forge") and intent is not None:
            pub = rng.choice(PUBLICATIONS)
            if op == "forge":
                forged_record = dataclasses.replace(intent.record, device="other")
                intent = dataclasses.replace(intent, record=forged_record)
                op = rng.choice(["put", "publish", "pub_commit", "commit"])
            call = {
                "put": lambda b, i=intent: b.store.put_record(i),
                "publish": lambda b, i=intent, p=pub: b.store.mark_outbox_published(i, p),
                "pub_commit": lambda b, i=intent, p=pub: b.store.mark_published_and_committed(i, p),
                "commit": lambda b, i=intent: b.store.mark_committed(i),
            }[op]
        elif op == "load" and intent is not None:
            conv = rng.choice([intent.conversation, "c2"])
            call = lambda b, i=intent, c=conv: b.store.load_commit(i.key, c)  # noqa: E731
        elif op == "load_req" and cmid in requests:
            call = lambda b, r=requests[cmid]: b.store.load_commit_for_request(r)  # noqa: E731
        elif op == "history":
            query = HistoryQuery(
                tenant,
                rng.choice(["c1", "c2", "nope"]),
                rng.choice(["alice", "bob", "eve"]),
                rng.choice(list(Direction)),
                rng.randrange(0, 8),
                rng.randrange(1, 5),
                rng.choice([1024, 1 << 20]),
            )
            call = lambda b, q=query: b.store.history_page(q)  # noqa: E731
        elif op == "scan":
            bound = clock_m.now_ms() + rng.randrange(-500, 500)
            call = lambda b, o=bound: _scan(b, o)  # noqa: E731
        elif op == "members":
            users = rng.sample(["alice", "bob", "eve"], 2)
            verb = rng.choice(["add_members", "remove_members"])
            call = lambda b, u=users, v=verb: getattr(b.membership, v)(tenant, "c1", u)  # noqa: E731
        elif op == "tick":
            jump = rng.choice([100, 600, 1_100, 3_100])
            clock_m.advance(jump)
            clock_r.advance(jump)
            continue
        else:
            continue
        got_m, got_r = await _both(call, memory, redis)
        assert got_r == got_m, f"seed {seed}, steps {log[-8:]}"
        kind, value = got_m
        if kind != "ok" or op not in ("reserve", "load", "load_req", "put", "publish"):
            continue
        if isinstance(value, Reserved | InProgress):
            intents[cmid] = value.intent
            if op == "reserve":
                requests[cmid] = req
        elif op == "put" and intent is not None and intent.state is CommitState.RESERVED:
            intents[cmid] = intent.advanced(CommitState.RECORDED)
