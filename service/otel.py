"""Tracing on: the OpenTelemetry SDK, its instrumentations, and the span scrubber.

Imported only by ``service.tracing.from_environment`` when an OTLP endpoint
is configured (the ``otel`` extra). One commit over gRPC makes one trace::

    /message_committer.v1.MessageCommitterService/Commit  SERVER   (instrumentation-grpc)
      MembershipStore.membership                          INTERNAL (TracedMembership)
        HGETALL  or  CQL <statement>                      CLIENT   (redis-py / CqlSession)
      MessageStore.reserve                                INTERNAL (InstrumentedStore)
        EVALSHA  or  CQL <statement> ...                  CLIENT
      MessageStore.put_record, Outbox.publish, MessageStore.mark_published_and_committed

* **Server spans** come from ``opentelemetry-instrumentation-grpc``'s aio
  interceptor (W3C ``traceparent`` from the caller is honoured). Health checks
  are not traced.
* **Store, membership and outbox spans** are opened by the service around
  every port call (``InstrumentedStore`` and the wrappers below).
* **Redis commands**: ``opentelemetry-instrumentation-redis`` patches redis-py
  globally (set up before the backend opens its client).
* **CQL requests**: a span around ``CqlSession``'s request boundary (its
  ``interceptor`` hook), named after the backend's statement name, from the
  request being sent until its answer is back on the event loop.
  ``opentelemetry-instrumentation-cassandra`` is not used: it wraps
  ``Session.execute_async`` and ends its span when that call *returns*, i.e.
  once the request is queued, before any answer (measured: a 0.4 ms span
  around a 6.8 ms request), and it records the contact points.
* **Roots**: only server spans may start a trace. Background work (readiness
  probes, the recovery loop, the driver's own pings) is in the metrics, not
  in traces.

**Scrubbing** (``ScrubbingSpanProcessor``), applied to every span before any
exporter sees it: attributes are kept only when their key is in
``SPAN_ATTRIBUTES`` (RPC service/method/status code, db system, the store
operation, the CQL statement name, the backend name); everything else is
dropped, so no statement or command argument, peer or server address, port,
URL, user agent, user id or message body leaves the process, whatever an
instrumentation records. Events keep only ``exception.type`` (an exception's
message is a driver's text and may name a host), and a span's status keeps
its code without its description.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status
from opentelemetry.util.types import Attributes

from service.domain.model import (
    Admission,
    CommitIntent,
    MembershipInfo,
    MembersSlice,
    OutboxPage,
    OutboxPublication,
)
from service.domain.ports import Backend, Hook, MembershipStore, Outbox
from service.metrics import StepSpan
from service.tracing import Tracing

SERVICE_NAME = "message-committer"
SCOPE = "message-committer"
SPAN_ATTRIBUTES = frozenset(
    {
        "rpc.system",
        "rpc.service",
        "rpc.method",
        "rpc.grpc.status_code",
        "db.system",
        "db.system.name",
        "mc.backend",
        "mc.operation",
        "mc.cql.statement",
    }
)
"""The only span attribute keys that leave the process."""
EVENT_ATTRIBUTES = frozenset({"exception.type", "exception.escaped"})
"""The only event attribute keys that leave the process."""


# --- scrubbing -----------------------------------------------------------------------


def _keep(attributes: Attributes, allowed: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if k in allowed}


def scrub(span: ReadableSpan) -> ReadableSpan:
    """A copy of ``span`` with only allow-listed attributes and no status text."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_keep(span.attributes, SPAN_ATTRIBUTES),
        events=[
            Event(e.name, _keep(e.attributes, EVENT_ATTRIBUTES), e.timestamp) for e in span.events
        ],
        links=[Link(link.context, _keep(link.attributes, SPAN_ATTRIBUTES)) for link in span.links],
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class ScrubbingSpanProcessor(SpanProcessor):
    """Hands ``inner`` a scrubbed copy of every finished span."""

    def __init__(self, inner: SpanProcessor) -> None:
        self._inner = inner

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        self._inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self._inner.on_end(scrub(span))

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


# --- sampling ------------------------------------------------------------------------


class ServerRootsOnly(Sampler):
    """Only a SERVER span may start a trace; everything else follows ``inner``.

    A span without a parent that is not an RPC (a readiness probe's store
    call, a driver's ping, a recovery run) is dropped, and so are its children.
    """

    def __init__(self, inner: Sampler) -> None:
        self._inner = inner

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid and kind is not SpanKind.SERVER:
            return SamplingResult(Decision.DROP)
        return self._inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"ServerRootsOnly{{{self._inner.get_description()}}}"


# --- the service's hooks ---------------------------------------------------------------


def _resource() -> Resource:
    resource = Resource.create({"service.version": _version()})
    name = str(resource.attributes.get("service.name", ""))
    if not name or name.startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    return resource


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("message-committer")
    except PackageNotFoundError:
        return "unknown"


class OtelTracing(Tracing):
    """Tracing on, exporting over OTLP/gRPC through the scrubber."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer(SCOPE, _version())

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> OtelTracing:
        """Set up the SDK from the OTEL_* variables and instrument redis-py globally.

        The OTLP exporter reads its own variables (endpoint, headers,
        certificate, timeout) from the process environment."""
        del environ  # the SDK and the exporter read os.environ themselves
        resource = _resource()
        configured = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        provider = TracerProvider(resource=resource, sampler=ServerRootsOnly(configured))
        provider.add_span_processor(ScrubbingSpanProcessor(BatchSpanProcessor(OTLPSpanExporter())))
        trace.set_tracer_provider(provider)
        RedisInstrumentor().instrument(tracer_provider=provider)
        return cls(provider)

    def span(self, name: str, operation: str, backend: str) -> AbstractContextManager[object]:
        return self._tracer.start_as_current_span(
            name, attributes={"mc.operation": operation, "mc.backend": backend}
        )

    def store_span(self, backend: str) -> StepSpan:
        def step(operation: str) -> AbstractContextManager[object]:
            return self.span("MessageStore." + operation, operation, backend)

        return step

    def server_interceptors(self) -> list[Any]:
        return [
            aio_server_interceptor(  # type: ignore[no-untyped-call]
                tracer_provider=self._provider, filter_=filters.negate(filters.health_check())
            )
        ]

    def wrap_backend(self, backend: Backend) -> Backend:
        self._trace_cql(backend)
        return dataclasses.replace(
            backend,
            membership=TracedMembership(backend.membership, self, backend.name),
            outbox=TracedOutbox(backend.outbox, self, backend.name),
        )

    def _trace_cql(self, backend: Backend) -> None:
        """Put a span around every request of a Scylla backend's CqlSession."""
        cql = getattr(backend.store, "cql", None)
        if cql is None or not hasattr(cql, "interceptor"):
            return
        previous = cql.interceptor
        tracer = self._tracer

        async def traced(name: str, send: Callable[[], Awaitable[Any]]) -> Any:
            with tracer.start_as_current_span(
                f"CQL {name}",
                kind=SpanKind.CLIENT,
                attributes={"db.system": "cassandra", "mc.cql.statement": name},
            ):
                if previous is not None:
                    return await previous(name, send)
                return await send()

        cql.interceptor = traced

    def trace_ids(self) -> tuple[str, str] | None:
        ctx = trace.get_current_span().get_span_context()
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return None
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")

    def shutdown(self) -> None:
        self._provider.shutdown()


class TracedMembership(MembershipStore):
    """A MembershipStore whose every call is a span ``MembershipStore.<call>``."""

    def __init__(self, inner: MembershipStore, tracing: OtelTracing, backend: str) -> None:
        self._inner = inner
        self._tracing = tracing
        self._backend = backend

    def _span(self, operation: str) -> AbstractContextManager[object]:
        return self._tracing.span("MembershipStore." + operation, operation, self._backend)

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipInfo:
        with self._span("create_conversation"):
            return await self._inner.create_conversation(tenant, conversation, members)

    async def add_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        with self._span("add_members"):
            return await self._inner.add_members(tenant, conversation, users)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        with self._span("remove_members"):
            return await self._inner.remove_members(tenant, conversation, users)

    async def admission(self, tenant: str, conversation: str, user: str) -> Admission | None:
        with self._span("admission"):
            return await self._inner.admission(tenant, conversation, user)

    async def member_intervals(
        self, tenant: str, conversation: str, user: str
    ) -> tuple[int, ...] | None:
        with self._span("member_intervals"):
            return await self._inner.member_intervals(tenant, conversation, user)

    async def members_at(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        with self._span("members_at"):
            return await self._inner.members_at(tenant, conversation, version, after, limit)

    async def membership_info(self, tenant: str, conversation: str) -> MembershipInfo | None:
        with self._span("membership_info"):
            return await self._inner.membership_info(tenant, conversation)


class TracedOutbox(Outbox):
    """An Outbox whose every call is a span ``Outbox.<call>``."""

    def __init__(self, inner: Outbox, tracing: OtelTracing, backend: str) -> None:
        self._inner = inner
        self._tracing = tracing
        self._backend = backend

    def _span(self, operation: str) -> AbstractContextManager[object]:
        return self._tracing.span("Outbox." + operation, operation, self._backend)

    def underlying(self) -> Outbox:
        return self._inner.underlying()

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        with self._span("publish"):
            return await self._inner.publish(intent, sent)

    async def read(self, after: str, limit: int) -> OutboxPage:
        with self._span("read"):
            return await self._inner.read(after, limit)

    async def readiness(self) -> None:
        with self._span("readiness"):
            await self._inner.readiness()
