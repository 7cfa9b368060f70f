"""A real OTLP/gRPC trace receiver for the tests: what a collector would be handed.

``OtlpReceiver`` serves ``opentelemetry.proto.collector.trace.v1.TraceService``
on 127.0.0.1 (a port of its own) in a thread pool, so a ``serve`` subprocess
with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at it exports over the real
exporter and wire format. Every span received is kept, decoded, with its
resource's attributes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int
    status_message: str
    resource: dict[str, Any]
    scope: str
    start_ns: int

    def texts(self) -> list[str]:
        """Every string this span carries anywhere (for secret searches)."""
        out = [self.name, self.status_message, self.scope]
        for attrs in (self.attributes, self.resource, *(a for _, a in self.events)):
            out += [f"{k}={v!r}" for k, v in attrs.items()]
        out += [name for name, _ in self.events]
        return out


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        got = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        ReceivedSpan(
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes=_attributes(s.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in s.events],
                            status_code=s.status.code,
                            status_message=s.status.message,
                            resource=resource,
                            scope=ss.scope.name,
                            start_ns=s.start_time_unix_nano,
                        )
                    )
        with self.lock:
            self.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """The receiver; ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT should say."""

    def __init__(self) -> None:
        self._collector = _Collector()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self._collector, self._server
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[ReceivedSpan]:
        with self._collector.lock:
            return list(self._collector.spans)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 20.0
    ) -> list[ReceivedSpan]:
        """The spans once ``done(spans)`` holds; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.spans()
            if done(spans):
                return spans
            time.sleep(0.05)
        names = [s.name for s in self.spans()]
        raise AssertionError(f"spans not received in {timeout_s}s: {names}")

    def stop(self) -> None:
        self._server.stop(grace=None)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.stop()


def tracing_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The environment that points a ``serve`` process at ``receiver``, exporting fast."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "mc-under-test",
    }
