"""Distributed tracing with OpenTelemetry: on only when an OTLP endpoint is configured.

Tracing follows the standard OpenTelemetry environment variables, read once at
start-up by ``from_environment``:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
  set: spans go to that OTLP/gRPC receiver (a collector, an agent, Tempo,
  Jaeger...). Unset: tracing is off and **nothing of OpenTelemetry is
  imported**; every hook below is None or a no-op, so a commit pays nothing.
* ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off
  even with an endpoint; ``OTEL_SERVICE_NAME`` (default
  ``message-committer``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``
  / ``_ARG``, ``OTEL_EXPORTER_OTLP_HEADERS`` / ``_CERTIFICATE`` / ``_TIMEOUT``
  and ``OTEL_BSP_*`` mean what the specification says.
* Only the gRPC protocol is shipped (``OTEL_EXPORTER_OTLP_PROTOCOL`` unset or
  ``grpc``); anything else, or an endpoint without the ``otel`` extra
  installed, stops start-up with a ConfigError (exit code 2) instead of
  silently not tracing.

What is traced, and what is scrubbed from every span before it leaves the
process, is in ``service.otel`` (the only module that imports OpenTelemetry)
and docs/operating.md.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from service.config import ConfigError
from service.domain.ports import Backend
from service.metrics import StepSpan

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


class Tracing:
    """The service's hooks into tracing. This base class is tracing off."""

    enabled = False

    def store_span(self, backend: str) -> StepSpan | None:
        """The span factory for InstrumentedStore (None: no spans, no cost)."""
        return None

    def server_interceptors(self) -> list[Any]:
        """grpc.aio server interceptors to put first (outermost)."""
        return []

    def wrap_backend(self, backend: Backend) -> Backend:
        """``backend`` with its membership and outbox calls (and CQL requests) traced."""
        return backend

    def trace_ids(self) -> tuple[str, str] | None:
        """(trace id, span id) in hex of the current sampled span, for log lines."""
        return None

    def shutdown(self) -> None:
        """Export what is still buffered (bounded by OTEL_EXPORTER_OTLP_TIMEOUT)."""


OFF = Tracing()


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def from_environment(environ: Mapping[str, str]) -> Tracing:
    """OFF, or tracing set up from the standard variables (see the module docstring)."""
    if not wanted(environ):
        return OFF
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() not in ("", "otlp"):
        raise ConfigError("OTEL_TRACES_EXPORTER must be otlp or none")
    protocol = next((environ[n] for n in PROTOCOL_VARIABLES if environ.get(n)), "grpc")
    if protocol.strip().lower() != "grpc":
        raise ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL: only grpc is supported")
    if not _installed("opentelemetry.sdk"):
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is not installed "
            "(pip install 'message-committer[otel]')"
        )
    otel = importlib.import_module("service.otel")
    tracing: Tracing = otel.OtelTracing.from_environment(environ)
    return tracing


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing (or blocked)
        return False
