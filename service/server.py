"""The gRPC server process: one grpc.aio server plus its side tasks.

``CommitServer`` owns, for one process:

* the grpc.aio server with the v1 services (commits, membership, recovery
  admin, mailboxes), ``grpc.health.v1`` and server reflection, behind the
  one StatusInterceptor;
* the readiness probe that drives health, and the recovery loop;
* on a backend whose data lives in this process (memory), the outbox relay
  too (``service.relay_runner``); on the others it is ``message-committer relay``;
* the HTTP side port (/metrics, /healthz, /readyz);
* the backend, which it closes last.

Shutdown order (``stop``): health turns NOT_SERVING for good, Subscribe
streams end, the side loops stop, ``server.stop(grace)`` lets in-flight RPCs
finish while refusing new ones, the HTTP side closes, then the backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.api.admin import MembershipServicer
from service.api.gate import WriteGate
from service.api.interceptor import StatusInterceptor
from service.api.limits import RpcLimits
from service.api.mailbox import MailboxServicer
from service.api.recovery_admin import RecoveryAdminServicer
from service.api.servicer import CommitterServicer
from service.backend_clock import BackendClock
from service.config import ConfigError, ServiceConfig, read_file, split_address
from service.domain.committer import MessageCommitter
from service.domain.ports import Backend, Clock
from service.gen.message_committer.v1 import (
    committer_pb2,
    committer_pb2_grpc,
    mailbox_pb2,
    mailbox_pb2_grpc,
    membership_pb2,
    membership_pb2_grpc,
    recovery_pb2,
    recovery_pb2_grpc,
)
from service.health import ReadinessHealthServicer, ReadinessProbe
from service.httpside import HttpSide
from service.metrics import InstrumentedStore, ServiceMetrics
from service.recovery import RecoveryLoop
from service.relay_runner import RelayRunner
from service.tasks import cancel_and_wait

log = logging.getLogger(__name__)

COMMITTER_SERVICE = committer_pb2.DESCRIPTOR.services_by_name["MessageCommitterService"].full_name
MEMBERSHIP_SERVICE = membership_pb2.DESCRIPTOR.services_by_name[
    "ConversationMembershipService"
].full_name
RECOVERY_SERVICE = recovery_pb2.DESCRIPTOR.services_by_name["RecoveryAdminService"].full_name
MAILBOX_SERVICE = mailbox_pb2.DESCRIPTOR.services_by_name["MailboxService"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
SERVICES = (COMMITTER_SERVICE, MEMBERSHIP_SERVICE, RECOVERY_SERVICE, MAILBOX_SERVICE)
LOOP_STOP_TIMEOUT_S = 5.0


class CommitServer:
    """Starts, serves and stops one replica of the service."""

    def __init__(
        self,
        config: ServiceConfig,
        backend: Backend,
        committer: MessageCommitter,
        store: InstrumentedStore,
        metrics: ServiceMetrics,
        clock: Clock,
        *,
        interceptors: Sequence[aio.ServerInterceptor] = (),
        relay: RelayRunner | None = None,
    ) -> None:
        """``interceptors`` run outside the StatusInterceptor (tracing's server span);
        ``relay`` runs inside this server (the memory backend's)."""
        if backend.delivery is None:
            raise ValueError("a server needs its backend's delivery side")
        self.config = config
        self.clock = clock
        self.backend = backend
        self.relay = relay
        self.committer = committer
        self.metrics = metrics
        self.health = ReadinessHealthServicer()
        self.gate = WriteGate()
        self.probe = ReadinessProbe(
            committer,
            self.health,
            metrics,
            backend=backend.name,
            durable=backend.durable,
            services=SERVICES,
            interval_s=config.readiness_interval,
            timeout_s=config.readiness_timeout,
            gate=self.gate,
        )
        self.recovery = RecoveryLoop(
            committer,
            store,
            metrics,
            clock,
            interval_s=config.recovery_interval,
            grace_s=config.recovery_grace,
            batch=config.recovery_batch,
            gate=self.gate,
        )
        self.http = HttpSide(metrics.registry, lambda: self.probe.readiness)
        self._server = aio.server(
            interceptors=[
                *interceptors,
                StatusInterceptor(
                    metrics,
                    config.max_message_bytes,
                    RpcLimits(
                        max_unary=config.max_concurrent_rpcs,
                        max_streams=config.max_streams,
                        max_streams_per_user=config.max_streams_per_user,
                    ),
                    self.gate,  # the write methods refuse while closed
                ),
            ],
            options=[
                # The transport refuses only requests over twice the limit; between
                # the two, the interceptor answers from the error table, with ErrorInfo.
                ("grpc.max_receive_message_length", 2 * config.max_message_bytes),
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.so_reuseport", 0),  # a port in use fails start-up, never shares
            ],
            # no transport limit: it would count every stream for its whole life
            # (service/api/limits.py counts unary RPCs and streams apart)
        )
        committer_pb2_grpc.add_MessageCommitterServiceServicer_to_server(
            CommitterServicer(
                committer,
                clock,
                idempotency_window_ms=config.store_settings().idempotency_window_ms,
            ),
            self._server,
        )
        membership_pb2_grpc.add_ConversationMembershipServiceServicer_to_server(
            MembershipServicer(
                backend.membership,
                backend.delivery,
                config.fanout_threshold,
                clock,
                history_retention_ms=config.store_settings().history_retention_ms,
            ),
            self._server,
        )
        self._stopping = asyncio.Event()
        mailbox_pb2_grpc.add_MailboxServiceServicer_to_server(
            MailboxServicer(
                backend.delivery,
                backend.membership,
                clock,
                poll_interval_s=config.subscribe_poll_interval,
                stopping=self._stopping,
            ),
            self._server,
        )
        recovery_pb2_grpc.add_RecoveryAdminServiceServicer_to_server(
            RecoveryAdminServicer(committer), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (*SERVICES, HEALTH_SERVICE, reflection.SERVICE_NAME), self._server
        )
        self._stop_loops = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self.grpc_port = 0
        self.http_port = 0

    def _bind_grpc(self) -> int:
        address = self.config.grpc_address
        try:
            if not self.config.tls_cert:
                return self._server.add_insecure_port(address)
            client_ca = self.config.tls_client_ca
            credentials = grpc.ssl_server_credentials(
                [(read_file(self.config.tls_key), read_file(self.config.tls_cert))],
                root_certificates=read_file(client_ca) if client_ca else None,
                require_client_auth=bool(client_ca),
            )
            return self._server.add_secure_port(address, credentials)
        except RuntimeError:
            raise ConfigError(
                "cannot listen on MC_GRPC_ADDRESS/--grpc-address (in use or not a local address)"
            ) from None

    async def start(self) -> None:
        """Bind both ports, probe once, then serve. Raises ConfigError on a bad bind."""
        self.grpc_port = self._bind_grpc()
        if isinstance(self.clock, BackendClock):
            await self.clock.try_sync()  # before anything reads "now"
        await self.probe.probe_once()
        await self._server.start()
        host, port = split_address(self.config.http_address, "MC_HTTP_ADDRESS")
        try:
            self.http_port = await self.http.start(host, port)
        except OSError:
            await self._server.stop(None)
            raise ConfigError(
                "cannot listen on MC_HTTP_ADDRESS/--http-address (in use or not a local address)"
            ) from None
        self._loops = [
            asyncio.create_task(self.probe.run(self._stop_loops), name="readiness-probe"),
            asyncio.create_task(self.recovery.run(self._stop_loops), name="recovery-loop"),
            asyncio.create_task(
                self.recovery.watch_queue(self._stop_loops, self.config.readiness_interval),
                name="recovery-gauges",
            ),
        ]
        if isinstance(self.clock, BackendClock):
            sync = self.clock.run(self._stop_loops, self.config.readiness_interval)
            self._loops.append(asyncio.create_task(sync, name="backend-clock"))
        if self.relay is not None:
            self._loops.append(asyncio.create_task(self._run_relay(), name="relay"))

    async def _run_relay(self) -> None:
        """The in-process relay (memory); an injected crash ends it, as in a relay process."""
        assert self.relay is not None
        try:
            await self.relay.run(self._stop_loops)
        except Exception as exc:
            log.error("the in-process relay stopped: %s", type(exc).__name__)

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, stop loops, drain RPCs, close HTTP and backend."""
        await self.probe.enter_shutdown()
        self._stopping.set()
        self._stop_loops.set()
        if self._loops:
            _, pending = await asyncio.wait(self._loops, timeout=LOOP_STOP_TIMEOUT_S)
            for task in pending:
                await cancel_and_wait(task)
        grace = self.config.shutdown_grace if grace_s is None else grace_s
        await self._server.stop(grace)
        await self.http.close()
        await self.backend.close()
        log.info("stopped")
