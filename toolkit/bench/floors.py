"""Floors: what the service could at best reach, measured in the same run.

* gRPC floor: ``grpc.health.v1.Health/Check`` on the very server under test,
  driven by the same client processes as the workloads. It is the stock
  async health servicer (plus one trailing-metadata entry), behind the same
  StatusInterceptor, so it pays for everything a Commit pays for on the
  gRPC side and nothing of the commit itself. (Workload ``grpc-floor``.)
* storage floor: the backend's own store objects, driven in this process
  without gRPC, the committer or metrics, at the same concurrency, with the
  calls the committer issues for a fresh send: membership read, reserve,
  put_record, outbox publish, then mark_published_and_committed (memory,
  redis) or mark_outbox_published + mark_committed (scylla), after the store's
  ``before_admission`` as the committer asks it. Its replay twin is the same
  for an already committed key (``before_admission``, else membership read +
  reserve).
* committer floor: ``MessageCommitter.commit_send`` on the same backend in
  this process: the domain's whole commit path, without gRPC or metrics.
* lwt floor (Scylla): one ``INSERT ... IF NOT EXISTS`` per op on a fresh
  partition, through the backend's own driver session, at the same
  concurrency: the cheapest conditional write, so a commit's cost reads as a
  multiple of it. The rows live 60 s (tenant ``bench-lwt-floor``).

The in-process floors run on the server's event loop while the server is
idle, which is the same single process a replica has.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable

from service.domain.committer import MessageCommitter, new_message_id
from service.domain.errors import StoreAlreadyExists
from service.domain.limits import CommitLimits
from service.domain.model import (
    AuthenticatedSend,
    CommitState,
    Committed,
    FrozenDeliveryInput,
    MessageContent,
    MessageType,
    ReserveCandidate,
    Reserved,
    ReserveResult,
)
from service.domain.ports import Backend, SystemClock
from toolkit.bench.driver import BenchError, PhaseResult, Tally, gc_seconds
from toolkit.bench.workloads import DEVICE, Population

Op = Callable[[], Awaitable[None]]
REPLAY_POOL_CAP = 50_000
LWT_FLOOR = (
    "INSERT INTO {ks}.commits (tenant, sender, cmid, state) VALUES (?, ?, ?, 'lwt-floor')"
    " IF NOT EXISTS USING TTL 60"
)


async def lwt_floor_op(backend: Backend, run_tag: str) -> Op | None:
    """One conditional insert per call through the backend's CQL session; None when
    the backend is not Scylla."""
    cql = getattr(backend.store, "cql", None)
    if backend.name != "scylla" or cql is None:
        return None
    await cql.prepare({"bench.lwt_floor": LWT_FLOOR})
    counter = [0]

    async def op() -> None:
        counter[0] += 1
        if not await cql.cas("bench.lwt_floor", ("bench-lwt-floor", run_tag, str(counter[0]))):
            raise RuntimeError("the lwt floor met an existing row")

    return op


async def run_ops(
    op: Op,
    streams: int,
    duration_s: float,
    max_calls: int,
    progress: Callable[[int], None],
) -> PhaseResult:
    """Run ``op`` from ``streams`` coroutines until the budget or the time is spent."""
    tally = Tally(progress)
    budget = [max_calls]
    deadline = time.monotonic() + duration_s
    perf = time.perf_counter

    async def stream() -> None:
        while budget[0] > 0 and time.monotonic() < deadline:
            budget[0] -= 1
            start = perf()
            try:
                await op()
            except BenchError:
                raise
            except Exception as exc:  # counted by type, as a status code would be
                tally.record(perf() - start, type(exc).__name__, False)
                await asyncio.sleep(0.001)
                continue
            tally.record(perf() - start, "OK", True)

    tally.result.started = time.time()
    cpu, gc_s = time.process_time(), gc_seconds()
    await asyncio.gather(*(stream() for _ in range(streams)))
    tally.result.server_cpu_s = time.process_time() - cpu
    tally.result.server_gc_s = gc_seconds() - gc_s
    tally.result.ended = time.time()
    return tally.result


async def ensure_population(backend: Backend, population: Population) -> None:
    """Create the run's conversations in ``backend`` directly (existing ones are kept)."""
    p = population
    wanted = [(p.hot, [p.hot_member(j) for j in range(p.hot_members)])]
    for i in range(p.spread_conversations):
        wanted.append((p.spread(i), [p.spread_member(i, j) for j in range(p.members)]))
    for conversation, members in wanted:
        with contextlib.suppress(StoreAlreadyExists):
            await backend.membership.create_conversation(p.tenant, conversation, members)
    for i in range(p.big_conversations):
        everyone = p.big_members_of(i)
        with contextlib.suppress(StoreAlreadyExists):
            await backend.membership.create_conversation(p.tenant, p.big(i), everyone[:10_000])
        for start in range(10_000, len(everyone), 10_000):
            await backend.membership.add_members(
                p.tenant, p.big(i), everyone[start : start + 10_000]
            )


class StorageDriver:
    """Makes the sends of the in-process floors and keeps what committed."""

    def __init__(self, backend: Backend, population: Population, body_bytes: int, seed: int):
        self.backend = backend
        self.population = population
        self._rng = random.Random(seed)
        self._body = bytes(self._rng.choice(b"abcdefghij ") for _ in range(max(1, body_bytes)))
        self._counter = 0
        self._clock = SystemClock()
        self.committed: list[AuthenticatedSend] = []

    def new_send(self, prefix: str) -> AuthenticatedSend:
        p, rng = self.population, self._rng
        index = rng.randrange(p.spread_conversations)
        self._counter += 1
        return AuthenticatedSend(
            tenant=p.tenant,
            sender=p.spread_member(index, rng.randrange(p.members)),
            device=DEVICE,
            conversation=p.spread(index),
            cmid=f"{prefix}.{self._counter}",
            content=MessageContent(MessageType.TEXT, body=self._body),
        )

    def forget(self) -> None:
        """Let the replay pool go (up to ``REPLAY_POOL_CAP`` sends): the bench's own
        objects, which every full collection of the server's process would walk in
        the phases after the floors, and ``serve`` does not have."""
        self.committed = []

    def _remember(self, send: AuthenticatedSend) -> None:
        if len(self.committed) < REPLAY_POOL_CAP:
            self.committed.append(send)
        else:
            self.committed[self._rng.randrange(REPLAY_POOL_CAP)] = send

    async def fresh(self) -> None:
        """One fresh commit through the store objects, as the committer does it."""
        b = self.backend
        store = b.store
        send = self.new_send("sf")
        if await store.before_admission(send) is not None:
            raise RuntimeError("a new key was already known")
        delivery = await self._delivery(send)
        now = self._clock.now_ms()
        candidate = ReserveCandidate(new_message_id(now), now)
        result = await store.reserve(send, delivery, candidate)
        if not isinstance(result, Reserved):
            raise RuntimeError("reserve of a new key did not reserve")
        await store.put_record(result.intent)
        intent = result.intent.advanced(CommitState.RECORDED)
        publication = await b.outbox.publish(intent)
        await store.mark_published_and_committed(intent, publication)
        self._remember(send)

    async def _delivery(self, send: AuthenticatedSend) -> FrozenDeliveryInput:
        """The admission point lookup and the version the delivery is frozen at."""
        admission = await self.backend.membership.admission(
            send.tenant, send.conversation, send.sender
        )
        if admission is None or not admission.member:
            raise BenchError("the bench conversations are missing")
        return FrozenDeliveryInput.at_version(admission.version)

    async def replay(self) -> None:
        """One replay of a committed key, with the calls the committer makes."""
        if not self.committed:
            raise BenchError("the storage replay floor needs committed keys first")
        send = self._rng.choice(self.committed)
        b = self.backend
        known: ReserveResult | None = await b.store.before_admission(send)  # committer's order
        if known is None:
            delivery = await self._delivery(send)
            now = self._clock.now_ms()
            candidate = ReserveCandidate(new_message_id(now), now)
            known = await b.store.reserve(send, delivery, candidate)
        if not isinstance(known, Committed):
            raise RuntimeError("reserve of a committed key did not replay")

    def committer_op(self, limits: CommitLimits) -> Op:
        """One commit through a MessageCommitter of its own (no gRPC, no metrics)."""
        b = self.backend
        committer = MessageCommitter(b.store, b.membership, b.outbox, limits=limits)

        async def op() -> None:
            await committer.commit_send(self.new_send("cf"))

        return op
