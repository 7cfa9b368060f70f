"""RelayRunner: one relay's leases and partition workers (``message-committer relay``).

Every ``lease / 3`` the runner announces itself (``OutboxPartitions.relays``),
computes its fair share ``ceil(partitions / live relays)``, renews the leases
it holds, lets go of the ones beyond its share and claims free or expired
ones up to it, in an order of its own (rendezvous hashing of owner and
partition, so relays do not fight over the same ones). Each held partition
has one task that calls ``PartitionWork.step`` in a loop; partitions are
independent, entries of one partition are handled in order. An idle
partition waits on the backend's doorbell (memory, Redis) or polls every
``idle_wait`` (Scylla).

A step refused because another relay holds a newer token (LeaseLost,
StoreFenced) ends that partition's task at once: this relay was deposed. A
failed step is logged by error class and retried after the first retry
delay, reconciling first. ``InjectedCrash`` (tests) stops the whole runner
where it is, without releasing anything, as a crash would. A graceful stop
releases every lease, so other relays take over at once.

Once a minute (``DEAD_LETTER_SWEEP_MS``, and at the first round) the lease
round also drops the held partitions' dead letters older than
``MC_RELAY_DEAD_LETTER_RETENTION`` (``OutboxPartitions.trim_dead_letters``):
each drop counted and logged (counts only), and the number still held set as
a gauge, so dead letters are bounded but never go in silence.

A relay that shares its event loop with the server's RPCs (memory: its steps
never suspend) runs at most one partition step per loop turn
(``shares_loop``): partitions take turns through one lock, held into the
next loop turn, so the I/O poll (the RPCs) runs between any two steps. Without it,
every backlogged partition stepped in the same turn (128 steps of up to a
batch each, about a second of CPU), and each RPC waited that long per turn it
needed (Health/Check at 10 calls/s, p99.9 4.9 s, issue 27).

Such a relay may also wait ``busy_pause_s`` after a step that delivered
something (``MC_RELAY_BUSY_PAUSE``, 10 ms in ``serve``): under load a step
that runs as soon as the loop allows finds about two entries, and most of a
step's cost is per step (claim, records, targets, settle), so fewer, fuller
steps cost the server less CPU per commit; a message committed into an idle
partition is still delivered at once (the doorbell wakes it), one committed
while its partition pauses waits at most the pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import uuid
from dataclasses import dataclass, field

from service.domain.delivery import DeliveryPorts
from service.domain.errors import IllegalTransition, LeaseLost, StoreError, StoreFenced
from service.domain.faults import FaultPoints, InjectedCrash
from service.domain.lane_marks import LaneMarks
from service.domain.ports import Backend, Clock, SystemClock
from service.domain.relay import Lease, RelayPolicy
from service.domain.relay_worker import PartitionWork, StepResult
from service.domain.targets import Targets
from service.relay_metrics import RELAY_LOGGER, RelayMetrics
from service.tasks import cancel_and_wait, wait_event

log = logging.getLogger(RELAY_LOGGER)

STOP_TIMEOUT_S = 5.0
IDLE_SAFETY_S = 5.0
"""With a doorbell, an idle partition still looks for entries this often."""
DEAD_LETTER_SWEEP_MS = 60_000
"""How often a relay trims the dead letters of the partitions it holds."""
RECHECKS_S = (0.005, 0.015, 0.04)
"""Pauses of the quick looks of a partition that just went idle, before the doorbell."""


def new_owner() -> str:
    """A relay's id in the backend: random, so a restarted relay is a new holder."""
    return f"relay-{uuid.uuid4().hex[:16]}"


def preference(owner: str, partition: str) -> bytes:
    return hashlib.sha256(f"{owner}\x00{partition}".encode()).digest()


@dataclass
class _Worker:
    work: PartitionWork
    task: asyncio.Task[None] | None = None
    active: bool = True
    idle: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class RelayRunner:
    """Holds a fair share of the outbox partitions and delivers them."""

    def __init__(
        self,
        backend: Backend,
        *,
        policy: RelayPolicy,
        idle_wait_s: float,
        metrics: RelayMetrics,
        clock: Clock | None = None,
        owner: str | None = None,
        faults: FaultPoints | None = None,
        shares_loop: bool = False,
        busy_pause_s: float = 0.0,
    ) -> None:
        """``shares_loop``: this relay runs on the server's event loop (see the module);
        ``busy_pause_s``: its wait after a step that delivered something (0: none)."""
        if backend.delivery is None:
            raise ValueError("this backend has no delivery side")
        self._ports: DeliveryPorts = backend.delivery
        self._policy = policy.validate()
        self._targets = Targets(self._ports, backend.membership, policy.fanout_threshold)
        self._marks = LaneMarks()  # the lanes' high-water marks, over every partition held
        self._idle_s = idle_wait_s
        self._metrics = metrics
        self._clock = clock or SystemClock()
        self.owner = owner or new_owner()
        self.faults = faults or FaultPoints()
        self._held: dict[str, _Worker] = {}
        self._stop = asyncio.Event()
        self._became_idle = asyncio.Event()
        self._turn = asyncio.Lock() if shares_loop else None
        self._busy_pause_s = busy_pause_s
        self.crashed: InjectedCrash | None = None
        self.ready = False
        self.rounds = 0
        self._next_dead_sweep_ms = 0

    @property
    def held(self) -> tuple[str, ...]:
        return tuple(self._held)

    def lease(self, partition: str) -> Lease:
        return self._held[partition].work.lease

    # --- the main loop ---------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set (or an injected crash, which is re-raised)."""
        self._metrics.partitions.set(len(self._ports.partitions.partitions()))
        doorbell = asyncio.create_task(self._doorbell(), name="relay-doorbell")
        interval = self._policy.lease_ms / 3000
        try:
            while not stop.is_set() and self.crashed is None:
                try:
                    await self.maintain()
                except StoreError as exc:
                    self.ready = False
                    self._metrics.errors.labels(type(exc).__name__).inc()
                    log.warning("relay: lease round failed: %s", type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):  # not wait_for: see service.tasks
                        await self._first(stop)
        finally:
            self._stop.set()
            doorbell.cancel()
            await self._shutdown(release=self.crashed is None)
        if self.crashed is not None:
            raise self.crashed

    async def _first(self, stop: asyncio.Event) -> None:
        """Return when ``stop`` is set or the runner stops itself."""
        stopped = asyncio.create_task(stop.wait())
        own = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({stopped, own}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            own.cancel()

    async def maintain(self) -> None:
        """One lease round: announce, renew, release beyond the share, claim up to it."""
        partitions = self._ports.partitions
        names = partitions.partitions()
        live = await partitions.relays(self.owner, 2 * self._policy.lease_ms)
        self.ready = True
        self.rounds += 1
        share = math.ceil(len(names) / max(1, live))
        order = sorted(names, key=lambda p: preference(self.owner, p))
        await asyncio.gather(*(self._renew(name) for name in list(self._held)))
        for name in reversed(order):
            if len(self._held) <= share:
                break
            if name in self._held:
                self._held[name].active = False  # its task releases it after its step
                del self._held[name]
        for name in order:
            if len(self._held) >= share or self.crashed is not None:
                break
            if name not in self._held:
                lease = await partitions.acquire(name, self.owner, self._policy.lease_ms)
                if lease is not None:
                    self._start(lease)
        await self._gauges(live)
        if self._clock.now_ms() >= self._next_dead_sweep_ms:
            await self.trim_dead_letters()

    async def trim_dead_letters(self) -> None:
        """Drop the held partitions' dead letters older than the retention: counted,
        logged (counts only), and the number still held set as a gauge."""
        self._next_dead_sweep_ms = self._clock.now_ms() + DEAD_LETTER_SWEEP_MS
        dropped = held = 0
        for h in list(self._held.values()):
            try:
                trim = await self._ports.partitions.trim_dead_letters(h.work.lease)
            except StoreError as exc:  # deposed or unreachable: the next sweep tries again
                self._metrics.errors.labels(type(exc).__name__).inc()
                continue
            dropped += trim.dropped
            held += trim.held
        self._metrics.dead_letters_held.set(held)
        if dropped:
            self._metrics.dead_letters_trimmed.inc(dropped)
            log.warning(
                "relay: dropped %d dead letter%s older than MC_RELAY_DEAD_LETTER_RETENTION;"
                " %d still held in the partitions this relay holds",
                dropped, "" if dropped == 1 else "s", held,
            )  # fmt: skip

    async def _renew(self, name: str) -> None:
        held = self._held.get(name)
        if held is None:
            return
        lease = await self._ports.partitions.acquire(name, self.owner, self._policy.lease_ms)
        if self._held.get(name) is not held:  # its task let it go meanwhile
            return
        if lease is not None and lease.token == held.work.lease.token:
            held.work.renewed(lease)
            return
        held.active = False
        del self._held[name]
        if held.task is not None:
            held.task.cancel()  # another token now: whatever it was doing is refused anyway
        if lease is not None:  # our own lease had lapsed: start again under the new token
            self._start(lease)

    def _start(self, lease: Lease) -> None:
        if lease.taken_over:
            self._metrics.takeovers.inc()
        try:
            work = PartitionWork(
                lease,
                self._ports,
                self._targets,
                policy=self._policy,
                clock=self._clock,
                faults=self.faults,
                observer=self._metrics,
                marks=self._marks,
            )
        except InjectedCrash as crash:
            self._crash(crash)
            return
        held = _Worker(work)
        self._held[lease.partition] = held
        held.task = asyncio.create_task(self._work(held), name="relay-partition")

    async def _gauges(self, live: int) -> None:
        self._metrics.live_relays.set(live)
        self._metrics.partitions_held.set(len(self._held))
        found = await asyncio.gather(
            *(self._ports.partitions.oldest_pending_ms(h.work.lease) for h in self._held.values())
        )
        oldest = [ms for ms in found if ms is not None]
        age = self._clock.now_ms() - min(oldest) if oldest else 0
        self._metrics.lag.set(max(0, age) / 1000)

    # --- one partition -----------------------------------------------------------

    async def _work(self, held: _Worker) -> None:
        work = held.work
        quiet = 0  # steps in a row that found nothing
        try:
            while held.active and not self._stop.is_set():
                try:
                    result = await self._step(work)
                except InjectedCrash as crash:
                    self._crash(crash)
                    return
                except (LeaseLost, StoreFenced) as exc:
                    self._metrics.fenced.inc()
                    log.warning("relay: deposed from a partition (%s)", type(exc).__name__)
                    self._drop(held)
                    return
                except IllegalTransition:
                    self._metrics.errors.labels("IllegalTransition").inc()
                    log.error("relay: an illegal outbox transition; letting the partition go")
                    self._drop(held)
                    await self._release(work.lease)
                    return
                except StoreError as exc:
                    self._metrics.errors.labels(type(exc).__name__).inc()
                    log.warning("relay: a partition step failed: %s", type(exc).__name__)
                    await self._pause(self._policy.first_retry_ms / 1000)
                    continue
                if result.wait_ms:
                    await self._pause(min(result.wait_ms / 1000, self._idle_s))
                elif not result.worked:
                    if self._ports.partitions.has_doorbell and quiet < len(RECHECKS_S):
                        # Just gone idle: the doorbell's current wait may not include this
                        # partition yet, so look again shortly a few times first.
                        await self._pause(RECHECKS_S[quiet])
                    else:
                        await self._idle(held)
                    quiet += 1
                else:
                    quiet = 0
                    if self._busy_pause_s > 0:  # fewer, fuller steps (see the module)
                        await self._pause(self._busy_pause_s)
                    else:  # a backend that never awaits must not starve the loop
                        await asyncio.sleep(0)
        finally:
            if not held.active and self.crashed is None and work.lease.partition not in self._held:
                with contextlib.suppress(StoreError):
                    await self._release(work.lease)

    async def _step(self, work: PartitionWork) -> StepResult:
        if self._turn is None:
            return await work.step()
        async with self._turn:
            result = await work.step()
            # Hold the turn into the loop's next turn: a step of memory never suspends,
            # so released here, the other partitions would take it in this same turn.
            await asyncio.sleep(0)
        return result

    def _drop(self, held: _Worker) -> None:
        held.active = False
        name = held.work.lease.partition
        if self._held.get(name) is held:
            del self._held[name]

    async def _release(self, lease: Lease) -> None:
        with contextlib.suppress(StoreError):
            await self._ports.partitions.release(lease)

    async def _pause(self, seconds: float) -> None:
        await wait_event(self._stop, seconds)

    async def _idle(self, held: _Worker) -> None:
        """Wait for the doorbell to name this partition (a safety look every
        ``IDLE_SAFETY_S`` in case a ring was missed), or poll every ``idle_wait``."""
        if not self._ports.partitions.has_doorbell:
            await self._pause(self._idle_s)
            return
        held.idle = True
        self._became_idle.set()
        try:
            await wait_event(held.wake, max(self._idle_s, IDLE_SAFETY_S))
        finally:
            held.wake.clear()
            held.idle = False

    async def _doorbell(self) -> None:
        """Wait on the backend for the idle partitions, then wake them."""
        partitions = self._ports.partitions
        if not partitions.has_doorbell:
            return
        while not self._stop.is_set():
            idle = [name for name, h in self._held.items() if h.idle and not h.wake.is_set()]
            if not idle:
                self._became_idle.clear()
                await wait_event(self._became_idle, self._idle_s)
                continue
            try:
                ready = await partitions.wait(idle, int(self._idle_s * 1000))
            except StoreError:
                ready = idle
                await self._pause(self._idle_s)
            for name in ready:
                held = self._held.get(name)
                if held is not None:
                    held.wake.set()
            await asyncio.sleep(0)  # let the woken partitions run before looking again

    def _crash(self, crash: InjectedCrash) -> None:
        self.crashed = crash
        self._stop.set()

    async def _shutdown(self, *, release: bool) -> None:
        held = list(self._held.values())
        self._held.clear()
        for h in held:
            h.active = False
            h.wake.set()
            if h.task is not None and not release:
                h.task.cancel()
        tasks = [h.task for h in held if h.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                await cancel_and_wait(task)
        if release:
            for h in held:
                await self._release(h.work.lease)
        self._metrics.partitions_held.set(0)
