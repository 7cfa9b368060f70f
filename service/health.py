"""Readiness: a periodic, real probe of the backend that drives gRPC health.

Every ``interval`` the probe calls ``committer.readiness()``, which touches
the store and the outbox for real; it does not depend on recovery (a bad
intent in the recovery queue must never take a replica out of service:
DESIGN §12). The result sets the
standard ``grpc.health.v1`` status of the server ("") and of each served
service, and is what ``/readyz`` answers. Nothing here is a constant: a
backend that stops answering turns the server NOT_SERVING at the next probe,
and SERVING again once it answers.

The reason text names the backend and the exception type only; it never
carries an address, a key or a backend message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from service.api.gate import WriteGate
from service.domain.committer import MessageCommitter
from service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

DETAIL_KEY = "mc-readiness"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NOT_DURABLE_NOTE = "memory backend: not durable, data is lost when the process stops"


@dataclass(frozen=True, slots=True)
class Readiness:
    """The outcome of the last probe."""

    ready: bool
    reason: str


def _reason(exc: BaseException) -> str:
    """The error class, plus the store's own fixed text when it says what an
    operator must do (a wiped or replaced backend, a refused eviction policy)."""
    name = type(exc).__name__
    hint = getattr(exc, "operator_hint", "")
    return f"{name}: {hint}" if hint else name


class ReadinessHealthServicer(health_aio.HealthServicer):
    """The stock async health service, plus the last probe's reason as the
    trailing metadata ``mc-readiness`` of every Check."""

    def __init__(self) -> None:
        super().__init__()
        self.readiness = Readiness(False, "starting: no probe has run yet")

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        context.set_trailing_metadata(((DETAIL_KEY, self.readiness.reason),))
        response: health_pb2.HealthCheckResponse = await super().Check(request, context)
        return response


class ReadinessProbe:
    """Probes the backend and publishes the result to health and metrics."""

    def __init__(
        self,
        committer: MessageCommitter,
        health: ReadinessHealthServicer,
        metrics: ServiceMetrics,
        *,
        backend: str,
        durable: bool,
        services: Sequence[str],
        interval_s: float,
        timeout_s: float,
        gate: WriteGate | None = None,
    ) -> None:
        """``gate`` follows the probe: closed on a fail-closed cause (``service.api.gate``)."""
        self._committer = committer
        self._gate = gate or WriteGate()
        self._health = health
        self._metrics = metrics
        self._backend = backend
        self._durable = durable
        self._services = ("", *services)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._stopping = False

    @property
    def readiness(self) -> Readiness:
        return self._health.readiness

    async def probe_once(self) -> Readiness:
        """Probe now and publish the result (unless shutting down)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._committer.readiness()
        except Exception as exc:  # any failure of the probe means "not ready"
            cause = exc.__cause__ or exc  # the store's error, not its wrapper
            result = Readiness(False, f"{self._backend} backend not ready ({_reason(cause)})")
            self._gate.observe(cause, result.reason)
        else:
            note = "" if self._durable else f"; {NOT_DURABLE_NOTE}"
            result = Readiness(True, f"ready: {self._backend} backend answers{note}")
            self._gate.observe(None, "")
        self._metrics.ready.set(1 if result.ready else 0)
        await self._publish(result)
        return self.readiness

    async def _publish(self, result: Readiness) -> None:
        if self._stopping:
            return
        previous = self._health.readiness
        self._health.readiness = result
        if previous.ready != result.ready:
            level = logging.INFO if result.ready else logging.WARNING
            log.log(level, "readiness: %s", result.reason)
        for service in self._services:
            await self._health.set(service, SERVING if result.ready else NOT_SERVING)

    async def run(self, stop: asyncio.Event) -> None:
        """Probe every interval until ``stop`` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self._interval_s)
            except TimeoutError:
                await self.probe_once()

    async def enter_shutdown(self) -> None:
        """NOT_SERVING for good: what Kubernetes and load balancers see first."""
        self._stopping = True
        self._health.readiness = Readiness(False, "shutting down")
        await self._health.enter_graceful_shutdown()
