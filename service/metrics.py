"""Prometheus metrics of one server instance, in its own CollectorRegistry.

=================================================  =====================================
series                                             from
=================================================  =====================================
grpc_server_started_total{grpc_type,grpc_service,  the interceptor, per RPC started
  grpc_method}
grpc_server_handled_total{..., grpc_code}          the interceptor, per RPC finished
grpc_server_handling_seconds{...} (histogram)      the interceptor
message_committer_commits_total{outcome}           the committer (CommitObserver)
message_committer_rejections_total{reason}         the committer (CommitObserver)
message_committer_recovery_runs_total              the committer, per recover_due run
message_committer_recovered_intents_total          the committer
message_committer_recovery_failed_intents_total    the committer
message_committer_recovery_quarantined_total       the committer, per intent quarantined
message_committer_oldest_recoverable_age_seconds   the recovery loop (queue statistics)
message_committer_quarantined_intents              the recovery loop (queue statistics)
message_committer_backend_operation_seconds        InstrumentedStore, per store call
  {operation} (histogram)
message_committer_backend_requests_total{kind}     Backend.requests, read at scrape time
message_committer_backend_events_total{kind}       Backend.events, read at scrape time
message_committer_backend_info{backend,durable}    the bootstrap
=================================================  =====================================

No label ever carries an id, a message or an address.
"""

from __future__ import annotations

import time
from collections import Counter as _Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from service.domain.ids import CommitKey
from service.domain.model import (
    Abandonment,
    Admission,
    AuthenticatedSend,
    CommitIntent,
    CommittedMessage,
    FrozenDeliveryInput,
    HistoryPage,
    HistoryQuery,
    LoadedCommit,
    OutboxPublication,
    QuarantinePage,
    RecoveryItem,
    RecoveryReport,
    RecoveryStats,
    ReserveCandidate,
    ReserveResult,
)
from service.domain.ports import Hook, MessageStore, Outbox, StoredCommit

OUTCOMES = ("committed", "replayed", "conflict", "recoverable", "rejected")
REJECTION_REASONS = ("invalid", "not_member", "quota", "no_conversation")
_FAST_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class ServiceMetrics:
    """Every series of one server; also the committer's CommitObserver."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        grpc_labels = ("grpc_type", "grpc_service", "grpc_method")
        r = self.registry
        self.grpc_started = Counter(
            "grpc_server_started", "RPCs started on the server.", grpc_labels, registry=r
        )
        self.grpc_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by status code.",
            (*grpc_labels, "grpc_code"),
            registry=r,
        )
        self.grpc_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from the start of an RPC to its completion on the server.",
            grpc_labels,
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.commits = Counter(
            "message_committer_commits", "Commit outcomes.", ("outcome",), registry=r
        )
        self.rejections = Counter(
            "message_committer_rejections",
            "Sends rejected before reserve, by reason.",
            ("reason",),
            registry=r,
        )
        self.recovery_runs = Counter(
            "message_committer_recovery_runs", "recover_due runs.", registry=r
        )
        self.recovered_intents = Counter(
            "message_committer_recovered_intents",
            "Unfinished intents recovery brought to COMMITTED.",
            registry=r,
        )
        self.recovery_failed_intents = Counter(
            "message_committer_recovery_failed_intents",
            "Recovery attempts that failed (the intent is retried later, with backoff).",
            registry=r,
        )
        self.recovery_quarantined = Counter(
            "message_committer_recovery_quarantined",
            "Intents this replica quarantined (undecodable, or failed too often).",
            registry=r,
        )
        self.oldest_recoverable_age = Gauge(
            "message_committer_oldest_recoverable_age_seconds",
            "Age of the oldest unfinished intent (queued or quarantined); 0 when none.",
            registry=r,
        )
        self.quarantined = Gauge(
            "message_committer_quarantined_intents",
            "Intents in quarantine now: kept, never ACKed, waiting for an operator.",
            registry=r,
        )
        self.ready = Gauge(
            "message_committer_ready",
            "1 when the last real readiness probe of the backend and outbox passed, else 0.",
            registry=r,
        )
        self.backend_seconds = Histogram(
            "message_committer_backend_operation_seconds",
            "Latency of MessageStore operations, failures included.",
            ("operation",),
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.backend_info = Info(
            "message_committer_backend", "The backend this server runs on.", registry=r
        )
        # Every known outcome and reason exported from the start, and looked up once:
        # labels() per commit was a lock and a dict walk (issue 27).
        self._outcomes = {outcome: self.commits.labels(outcome) for outcome in OUTCOMES}
        self._reasons = {reason: self.rejections.labels(reason) for reason in REJECTION_REASONS}

    # --- CommitObserver ----------------------------------------------------

    def outcome(self, outcome: str, reason: str = "") -> None:
        child = self._outcomes.get(outcome)
        (self.commits.labels(outcome) if child is None else child).inc()
        if outcome == "rejected":
            reason = reason or "unknown"
            rejected = self._reasons.get(reason)
            (self.rejections.labels(reason) if rejected is None else rejected).inc()

    def recovered(self, report: RecoveryReport) -> None:
        self.recovery_runs.inc()
        self.recovered_intents.inc(report.committed)
        self.recovery_failed_intents.inc(report.failed)
        self.recovery_quarantined.inc(report.quarantined)

    # --- wiring --------------------------------------------------------------

    def describe_backend(
        self,
        name: str,
        durable: bool,
        requests: _Counter[str],
        events: _Counter[str] | None = None,
    ) -> None:
        self.backend_info.info({"backend": name, "durable": str(durable).lower()})
        self.registry.register(BackendRequestsCollector(requests))
        if events is not None:
            self.registry.register(backend_events(events))

    def watch_clock_offset(self, offset_ms: Callable[[], float | None]) -> None:
        """``message_committer_backend_clock_offset_seconds``: the backend's clock minus
        this replica's as last measured, read at scrape time (NaN before the first
        measurement)."""
        gauge = Gauge(
            "message_committer_backend_clock_offset_seconds",
            "The backend's clock minus this replica's, as last measured (NaN before).",
            registry=self.registry,
        )

        def seconds() -> float:
            value = offset_ms()
            return float("nan") if value is None else value / 1000

        gauge.set_function(seconds)


def backend_events(events: _Counter[str]) -> BackendRequestsCollector:
    """``message_committer_backend_events_total{kind}``: what a backend noticed about
    itself (the serve and relay processes both export it)."""
    return BackendRequestsCollector(
        events,
        "message_committer_backend_events",
        "What the backend noticed about itself, by kind.",
    )


class BackendRequestsCollector(Collector):
    """Exports a backend's request Counter as it is at scrape time."""

    def __init__(
        self,
        requests: _Counter[str],
        name: str = "message_committer_backend_requests",
        documentation: str = "Requests the backend issued to its dependency, by kind.",
    ) -> None:
        self._requests = requests
        self._name = name
        self._documentation = documentation

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=("kind",))
        for kind, count in sorted(self._requests.items()):
            family.add_metric((kind,), float(count))
        yield family

    def describe(self) -> Iterable[Metric]:
        return []


StepSpan = Callable[[str], AbstractContextManager[object]]
"""Opens the trace span of one store call (``service.tracing``); None when tracing is off."""


class InstrumentedStore(MessageStore):
    """A MessageStore that times every call of the store it wraps, and (tracing
    on) makes each call a span."""

    def __init__(
        self, inner: MessageStore, seconds: Histogram, step_span: StepSpan | None = None
    ) -> None:
        self._inner = inner
        self._seconds = seconds
        self._step_span = step_span
        self._children: dict[str, Histogram] = {}  # labels() per call is a lock + dict
        self.atomic_publish_commit = inner.atomic_publish_commit
        self.admits_in_reserve = inner.admits_in_reserve
        self.reads_before_admission = inner.reads_before_admission

    def _timer(self, operation: str) -> _Timer:
        child = self._children.get(operation)
        if child is None:
            child = self._children[operation] = self._seconds.labels(operation)
        span = self._step_span
        return _Timer(child, None if span is None else span(operation))

    async def reserve(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput,
        candidate: ReserveCandidate,
    ) -> ReserveResult:
        with self._timer("reserve"):
            return await self._inner.reserve(request, delivery, candidate)

    async def reserve_admitted(
        self,
        request: AuthenticatedSend,
        delivery: FrozenDeliveryInput | None,
        candidate: ReserveCandidate,
    ) -> ReserveResult | Admission | None:
        with self._timer("reserve"):
            return await self._inner.reserve_admitted(request, delivery, candidate)

    def pipelines_with(self, outbox: Outbox) -> bool:
        return self._inner.pipelines_with(outbox)

    async def finish_pipelined(
        self, intent: CommitIntent, outbox: Outbox, steps: int = 3
    ) -> CommittedMessage | None:
        with self._timer("finish_pipelined"):
            return await self._inner.finish_pipelined(intent, outbox, steps)

    async def put_record(self, intent: CommitIntent) -> None:
        with self._timer("put_record"):
            await self._inner.put_record(intent)

    async def mark_outbox_published(
        self, intent: CommitIntent, publication: OutboxPublication
    ) -> None:
        with self._timer("mark_outbox_published"):
            await self._inner.mark_outbox_published(intent, publication)

    async def mark_committed(self, intent: CommitIntent) -> CommittedMessage:
        with self._timer("mark_committed"):
            return await self._inner.mark_committed(intent)

    async def mark_published_and_committed(
        self, intent: CommitIntent, publication: OutboxPublication, between: Hook | None = None
    ) -> CommittedMessage:
        with self._timer("mark_published_and_committed"):
            return await self._inner.mark_published_and_committed(intent, publication, between)

    async def before_admission(self, request: AuthenticatedSend) -> LoadedCommit | None:
        with self._timer("before_admission"):
            return await self._inner.before_admission(request)

    async def _load(self, key: CommitKey) -> StoredCommit | None:
        with self._timer("load"):
            return await self._inner._load(key)

    async def load_commit(self, key: CommitKey, conversation: str) -> LoadedCommit | None:
        with self._timer("load_commit"):
            return await self._inner.load_commit(key, conversation)

    async def load_commit_for_request(self, request: AuthenticatedSend) -> LoadedCommit | None:
        with self._timer("load_commit_for_request"):
            return await self._inner.load_commit_for_request(request)

    async def scan_recoverable_commits(
        self, older_than_ms: int, max_items: int
    ) -> list[RecoveryItem]:
        with self._timer("scan_recoverable_commits"):
            return await self._inner.scan_recoverable_commits(older_than_ms, max_items)

    async def defer_recovery(
        self, item: RecoveryItem, *, retry_after_ms: int, quarantine: bool, problem: str
    ) -> None:
        with self._timer("defer_recovery"):
            await self._inner.defer_recovery(
                item, retry_after_ms=retry_after_ms, quarantine=quarantine, problem=problem
            )

    async def quarantined(self, after: str, limit: int) -> QuarantinePage:
        with self._timer("quarantined"):
            return await self._inner.quarantined(after, limit)

    async def recovery_item(self, key: CommitKey) -> RecoveryItem | None:
        with self._timer("recovery_item"):
            return await self._inner.recovery_item(key)

    async def release_quarantined(self, key: CommitKey) -> bool:
        with self._timer("release_quarantined"):
            return await self._inner.release_quarantined(key)

    async def abandon_quarantined(self, key: CommitKey, operator: str, reason: str) -> Abandonment:
        with self._timer("abandon_quarantined"):
            return await self._inner.abandon_quarantined(key, operator, reason)

    async def recovery_stats(self) -> RecoveryStats:
        with self._timer("recovery_stats"):
            return await self._inner.recovery_stats()

    async def history_page(self, query: HistoryQuery) -> HistoryPage:
        with self._timer("history_page"):
            return await self._inner.history_page(query)

    async def readiness(self) -> None:
        with self._timer("readiness"):
            await self._inner.readiness()

    async def close(self) -> None:
        await self._inner.close()


def instrument(
    store: MessageStore, metrics: ServiceMetrics, step_span: StepSpan | None = None
) -> InstrumentedStore:
    """Wrap ``store`` so every call is timed (and traced, with ``step_span``)."""
    return InstrumentedStore(store, metrics.backend_seconds, step_span)


class _Timer:
    """Observes the wall time of a ``with`` block, exceptions included, inside
    ``span`` when there is one."""

    __slots__ = ("_child", "_span", "_start")

    def __init__(self, child: Histogram, span: AbstractContextManager[object] | None) -> None:
        self._child = child
        self._span = span
        self._start = 0.0

    def __enter__(self) -> None:
        if self._span is not None:
            self._span.__enter__()
        self._start = time.perf_counter()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._child.observe(time.perf_counter() - self._start)
        if self._span is not None:
            self._span.__exit__(kind, exc, tb)
