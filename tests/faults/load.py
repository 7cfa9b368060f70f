"""Concurrent commit load for the process-fault tests, through ``service.client``.

``LoadDriver`` runs ``LoadPlan.workers`` client tasks against one gRPC
target, each over a channel of its own (reconnecting within half a second
once the server is back). Worker ``i`` is one sender's device in one
conversation, and op after op it

1. re-sends its oldest key that has no ACK yet (a client's pending queue: a
   key is retried, with the very same request, until it is ACKed or meets a
   definitive error);
2. every ``resend_every``-th op re-sends one of its ACKed keys at random (a
   deliberate retry, which must replay the same ACK);
3. otherwise sends a new key; every ``duplicate_every``-th new key is sent
   twice at once (a double tap racing itself).

Every call goes through ``CommitClient.commit``, which itself retries
UNAVAILABLE and timed-out attempts with the same request. ``LoadLog`` keeps
the request of every key (its identity), every ACK of every key, every error
by status code and exception class, and the counts.

The driver stops on ``stop()``, on its time budget (``duration_s``) or when
``max_keys`` new keys were sent. ``abandon()`` cancels part of the calls in
flight, as if those clients had crashed along with the service: their keys
are left alone until ``settle()``, so whatever a fault left unfinished of
them is for recovery to finish. ``settle()`` re-sends every key ever sent
(ACKed or not) until each has an ACK or a definitive error, bounded in
rounds and in time.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import grpc
from grpc import aio

from service.api.errors import RemoteError, rule_for
from service.client import CommitClient, RetryPolicy
from service.domain.errors import CommitError
from service.domain.ids import CommitKey
from service.domain.model import AuthenticatedSend, CommittedMessage, MessageContent, MessageType
from toolkit.campaign.invariants import Ledger

# Status codes after which the same request may still be ACKed later.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE.name,
        grpc.StatusCode.DEADLINE_EXCEEDED.name,
        grpc.StatusCode.RESOURCE_EXHAUSTED.name,
    }
)
# Reconnect to a restarted server within half a second (gRPC's default backoff
# starts at 1 s and grows to 2 minutes).
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
LOAD_RETRY = RetryPolicy(
    max_attempts=40,
    initial_backoff_s=0.05,
    max_backoff_s=0.5,
    attempt_timeout_s=5.0,
    deadline_s=15.0,
)
STOP_SLACK_S = 5.0
POLL_S = 0.02


def status_code(exc: CommitError) -> str:
    """The gRPC status code name an error came back with."""
    if isinstance(exc, RemoteError):
        return exc.code.name
    rule = rule_for(exc)
    return rule.code.name if rule is not None else grpc.StatusCode.UNKNOWN.name


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What the workers send, and the bounds of the run."""

    tenant: str
    conversations: tuple[str, ...]
    senders: tuple[str, ...]
    """Members of every conversation; worker ``i`` sends as ``senders[i % len]``."""
    workers: int = 24
    max_keys: int = 50_000
    """Count bound: new keys over all workers."""
    duration_s: float = 300.0
    """Time bound of the send loop: a safety net above every phase of a test (whose own
    waits are bounded), not a pace; the tests stop the load themselves."""
    resend_every: int = 5
    duplicate_every: int = 9
    retry: RetryPolicy = LOAD_RETRY


@dataclass
class KeyLog:
    """One key: its request and what every call of it was told."""

    request: AuthenticatedSend
    acks: list[CommittedMessage] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calls: int = 0
    definitive: str | None = None
    """The status of a non-retryable error (never expected in these tests)."""
    abandoned: bool = False
    """Its client gave up in a fault; only settle() sends it again."""


@dataclass
class LoadLog:
    """Everything the workers sent and were told."""

    keys: dict[CommitKey, KeyLog] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    pending_resends: int = 0
    deliberate_resends: int = 0
    duplicates: int = 0
    abandoned: int = 0
    settle_calls: int = 0

    def add(self, request: AuthenticatedSend) -> KeyLog:
        entry = self.keys[request.key] = KeyLog(request)
        return entry

    @property
    def acked_keys(self) -> int:
        return sum(1 for k in self.keys.values() if k.acks)

    @property
    def ack_count(self) -> int:
        return sum(len(k.acks) for k in self.keys.values())

    def unacked(self) -> list[KeyLog]:
        return [k for k in self.keys.values() if not k.acks]

    def definitive_errors(self) -> dict[CommitKey, str]:
        return {key: k.definitive for key, k in self.keys.items() if k.definitive is not None}

    def ledger(self) -> Ledger:
        """The ACKs as a ``toolkit.campaign.invariants.Ledger`` (readers not set)."""
        ledger = Ledger()
        for entry in self.keys.values():
            for ack in entry.acks:
                ledger.acked(entry.request, ack)
        return ledger


def _content(worker: int, n: int) -> MessageContent:
    return MessageContent(MessageType.TEXT, f"worker {worker} message {n}".encode())


class LoadDriver:
    """Concurrent clients committing through one gRPC target (see the module docstring)."""

    def __init__(self, target: str, plan: LoadPlan, *, seed: int = 1) -> None:
        if plan.workers < 1 or not plan.conversations or not plan.senders:
            raise ValueError("a plan needs workers, conversations and senders")
        self.target = target
        self.plan = plan
        self.log = LoadLog()
        self.in_flight = 0
        self._seed = seed
        self._clients: list[CommitClient] = []
        self._workers: list[asyncio.Task[None]] = []
        self._calls: dict[asyncio.Task[object], CommitKey] = {}
        self._stop = asyncio.Event()
        self._new_keys = 0

    # --- life cycle ------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _client(self) -> CommitClient:
        channel = aio.insecure_channel(self.target, options=list(CHANNEL_OPTIONS))
        return CommitClient(channel, self.plan.retry)

    def start(self) -> None:
        """Open the clients and start the workers."""
        if self._clients:
            raise RuntimeError("the driver was started already")
        self._clients = [self._client() for _ in range(self.plan.workers)]
        deadline = asyncio.get_running_loop().time() + self.plan.duration_s
        self._workers = [
            asyncio.create_task(self._worker(i, deadline), name=f"load-worker-{i}")
            for i in range(self.plan.workers)
        ]

    async def stop(self) -> None:
        """Stop sending: each worker ends after its current call (bounded; then cancelled)."""
        self._stop.set()
        if not self._workers:
            return
        _, late = await asyncio.wait(
            self._workers, timeout=self.plan.retry.deadline_s + STOP_SLACK_S
        )
        for task in late:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for task in self._workers:  # a worker that failed is a bug in the test: surface it
            if not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"{task.get_name()} failed") from task.exception()

    async def close(self) -> None:
        """Stop the workers and close every channel."""
        self._stop.set()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for client in self._clients:
            await client.close()

    @property
    def client_retries(self) -> int:
        """Attempts beyond the first inside ``CommitClient`` calls, over all clients."""
        return sum(c.retries for c in self._clients)

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until ``condition()`` holds; AssertionError naming ``what`` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not condition():
            if loop.time() >= deadline:
                raise AssertionError(
                    f"load: {what} not reached within {timeout_s:.0f}s "
                    f"({self.in_flight} calls in flight; {self.summary()})"
                )
            if self._workers and all(task.done() for task in self._workers):
                await self.stop()  # raises if a worker failed
                raise AssertionError(
                    f"load: the workers ended (time or count budget) before {what}; "
                    f"{self.summary()}"
                )
            await asyncio.sleep(POLL_S)

    async def wait_more_acks(
        self, count: int, timeout_s: float, *, min_in_flight: int = 0, what: str = ""
    ) -> None:
        """Wait for ``count`` more ACKed keys than now, with at least
        ``min_in_flight`` calls in flight at that moment (so a fault lands mid-load)."""
        goal = self.log.acked_keys + count
        await self.wait_until(
            lambda: self.log.acked_keys >= goal and self.in_flight >= min_in_flight,
            timeout_s,
            what or f"{goal} ACKed keys",
        )

    # --- faults ------------------------------------------------------------------

    def abandon(self, fraction: float = 0.5) -> set[CommitKey]:
        """Cancel about ``fraction`` of the calls in flight whose key has no ACK; those
        keys are not sent again until ``settle``. Returns the keys abandoned."""
        keys = sorted({key for key in self._calls.values() if not self.log.keys[key].acks}, key=str)
        chosen = set(keys[: round(len(keys) * fraction)])
        for task, key in list(self._calls.items()):
            if key in chosen:
                task.cancel()
        for key in chosen:
            self.log.keys[key].abandoned = True
        self.log.abandoned += len(chosen)
        return chosen

    # --- sending -------------------------------------------------------------------

    async def _worker(self, i: int, deadline: float) -> None:
        plan, log = self.plan, self.log
        loop = asyncio.get_running_loop()
        rng = random.Random(self._seed * 100_003 + i)
        client = self._clients[i]
        sender = plan.senders[i % len(plan.senders)]
        conversation = plan.conversations[i % len(plan.conversations)]
        pending: deque[CommitKey] = deque()
        acked: list[CommitKey] = []
        op = sent = 0
        while not self._stop.is_set() and loop.time() < deadline:
            op += 1
            copies = 1
            if pending:
                request = log.keys[pending.popleft()].request
                log.pending_resends += 1
            elif acked and op % plan.resend_every == 0:
                request = log.keys[rng.choice(acked)].request
                log.deliberate_resends += 1
            else:
                if self._new_keys >= plan.max_keys:
                    return
                self._new_keys += 1
                sent += 1
                request = AuthenticatedSend(
                    tenant=plan.tenant,
                    sender=sender,
                    device=f"device-{i}",
                    conversation=conversation,
                    cmid=f"w{i}-m{sent}",
                    content=_content(i, sent),
                )
                log.add(request)
                if (sent + i) % plan.duplicate_every == 0:  # workers out of step
                    copies = 2
                    log.duplicates += 1
            entry = log.keys[request.key]
            had_ack = bool(entry.acks)
            await self._send(client, request, copies)
            if entry.abandoned or entry.definitive is not None:
                continue
            if not entry.acks:
                pending.append(request.key)
            elif not had_ack:
                acked.append(request.key)

    async def _send(self, client: CommitClient, request: AuthenticatedSend, copies: int) -> None:
        calls = [asyncio.create_task(self._call(client, request)) for _ in range(copies)]
        try:
            await asyncio.wait(calls)  # a cancelled call (abandon) does not stop the worker
        finally:
            for task in calls:
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)

    async def _call(self, client: CommitClient, request: AuthenticatedSend) -> None:
        entry = self.log.keys[request.key]
        task = asyncio.current_task()
        assert task is not None
        self._calls[task] = request.key
        self.in_flight += 1
        self.log.calls += 1
        entry.calls += 1
        try:
            ack = await client.commit(request)
        except CommitError as exc:
            code = status_code(exc)
            label = f"{code}/{type(exc).__name__}"
            entry.errors.append(label)
            self.log.errors[label] += 1
            if code not in TRANSIENT_CODES:
                entry.definitive = label
        else:
            entry.acks.append(ack)
        finally:
            self.in_flight -= 1
            self._calls.pop(task, None)

    # --- the end -------------------------------------------------------------------

    async def settle(self, *, rounds: int = 6, timeout_s: float = 90.0) -> None:
        """Re-send every key ever sent, then again those still without an ACK, until
        each has one or a definitive error (``rounds`` and ``timeout_s`` bound it)."""
        if not self._stop.is_set():
            await self.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        gate = asyncio.Semaphore(len(self._clients))
        for round_no in range(rounds):
            todo = [
                k
                for k in self.log.keys.values()
                if k.definitive is None and (round_no == 0 or not k.acks)
            ]
            if not todo or loop.time() >= deadline:
                return
            if round_no:
                await asyncio.sleep(min(1.0, 0.2 * round_no))

            async def one(n: int, entry: KeyLog) -> None:
                async with gate:
                    self.log.settle_calls += 1
                    await self._call(self._clients[n % len(self._clients)], entry.request)

            try:
                await asyncio.wait_for(
                    asyncio.gather(*(one(n, k) for n, k in enumerate(todo))),
                    max(1.0, deadline - loop.time()),
                )
            except TimeoutError:
                return  # out of time: the verification names every key left without an ACK

    def summary(self) -> dict[str, object]:
        """The counts a test reports."""
        log = self.log
        return {
            "keys": len(log.keys),
            "acked_keys": log.acked_keys,
            "acks": log.ack_count,
            "calls": log.calls,
            "client_retries": self.client_retries,
            "pending_resends": log.pending_resends,
            "deliberate_resends": log.deliberate_resends,
            "duplicate_sends": log.duplicates,
            "abandoned": log.abandoned,
            "settle_calls": log.settle_calls,
            "keys_acked_more_than_once": sum(1 for k in log.keys.values() if len(k.acks) > 1),
            "errors": dict(sorted(log.errors.items())),
        }


def conversations_of(log: LoadLog) -> Iterable[tuple[str, str]]:
    """Every (tenant, conversation) the log sent to."""
    return sorted({(k.request.tenant, k.request.conversation) for k in log.keys.values()})
