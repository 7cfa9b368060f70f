"""The composition root: the only place that picks a backend and wires the service.

``open_backend`` opens exactly the backend the configuration names (no
default, no fallback), touches it for real, and fails closed with a
one-line StartupError: ConfigError (exit 2) for a bad or incomplete choice
or an unmigrated schema, BackendUnreachable (exit 3) when the dependency does
not answer. Backend modules are imported here, lazily, so the service loads
without the drivers of backends it does not use.

``build_server`` wires one replica around an opened backend; tests call it
with a backend of their own (a memory backend wrapped to fail on demand).
``serve`` is what ``message-committer serve`` runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from service.backend_clock import BackendClock
from service.config import ConfigError, ServiceConfig, StartupError
from service.domain.committer import MessageCommitter
from service.domain.errors import StoreMisconfigured, StoreSchemaError, StoreUnavailable
from service.domain.faults import FaultPoints
from service.domain.ports import Backend, Clock, OffsetClock, SystemClock
from service.eventloop import running_loop_name
from service.metrics import ServiceMetrics, instrument
from service.relay_metrics import RelayMetrics
from service.relay_runner import RelayRunner
from service.server import CommitServer
from service.tracing import OFF, Tracing

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 10.0
NOT_DURABLE_WARNING = (
    "the memory backend is NOT durable: every message is lost when this process stops; "
    "use redis or scylla for anything but a demo"
)


class BackendUnreachable(StartupError):
    """The chosen backend did not answer at start-up."""

    exit_code = 3


def _host_count(config: ServiceConfig) -> int:
    return {"memory": 0, "redis": 1}.get(config.backend, len(config.scylla_contact_points))


async def _open(config: ServiceConfig, clock: Clock) -> Backend:
    settings = config.store_settings()
    if config.backend == "memory":
        from backends.memory import open_memory_backend

        return open_memory_backend(
            settings=settings,
            clock=clock,
            mailbox=config.mailbox_settings(),
            dead_letter_retention_ms=config.delivery_settings().dead_letter_retention_ms,
        )
    if config.backend == "redis":
        from backends.redis import open_redis_backend

        return await open_redis_backend(  # Redis decides time itself (TIME)
            config.redis_url,
            prefix=config.redis_prefix,
            settings=settings,
            max_connections=config.redis_max_connections,
            allow_eviction=config.redis_allow_eviction,
            wait_replicas=redis_wait_replicas(config),
            wait_timeout_ms=int(config.redis_wait_timeout * 1000),
            delivery=config.delivery_settings(),
            deployment=_redis_deployment(config),
        )
    if config.backend == "scylla":
        from backends.scylla import open_scylla_backend
        from backends.scylla.tls import ClusterTls

        return await open_scylla_backend(
            list(config.scylla_contact_points),
            port=config.scylla_port,
            keyspace=config.scylla_keyspace,
            settings=settings,
            username=config.scylla_username or None,
            password=config.scylla_password or None,
            local_dc=config.scylla_local_dc or None,
            consistency=config.scylla_consistency,
            serial_consistency="LOCAL_SERIAL"
            if config.scylla_single_dc_conversations
            else "SERIAL",
            clock=clock,  # Scylla decides expiry by this clock, checked against the cluster
            max_clock_skew_ms=int(config.scylla_max_clock_skew * 1000),
            node_routes=config.scylla_node_routes() or None,
            delivery=config.delivery_settings(),
            send_path=config.scylla_send_path,
            tls=ClusterTls(
                config.scylla_tls_ca, config.scylla_tls_cert or None, config.scylla_tls_key or None
            )
            if config.scylla_tls_ca
            else None,
        )
    raise ConfigError("unknown backend: MC_BACKEND/--backend must be memory, redis or scylla")


def _redis_deployment(config: ServiceConfig) -> str | None:
    """The deployment identity this replica is told it serves (None: not told)."""
    identity = config.redis_deployment_identity()
    if not identity:
        log.warning(
            "MC_REDIS_DEPLOYMENT is not set: this replica serves whatever deployment the"
            " prefix holds, so a wiped Redis migrated again would be served as new; set it"
            " to the identity `migrate --backend redis` printed"
        )
        return None
    return identity


def redis_wait_replicas(config: ServiceConfig) -> int:
    """The replicas an ACK waits for: MC_REDIS_WAIT_REPLICAS, or auto (1 behind
    Sentinel or on a Cluster, whose failovers would lose unreplicated ACKs)."""
    from backends.redis.link import parse_url

    mode = parse_url(config.redis_url).mode
    replicated = mode in ("sentinel", "cluster")
    if config.redis_wait_replicas is None:
        return 1 if replicated else 0
    if replicated and config.redis_wait_replicas == 0:
        log.warning(
            "MC_REDIS_WAIT_REPLICAS=0 on a Redis %s: an ACK is given before any replica"
            " holds the commit, so a failover can lose acknowledged messages",
            mode,
        )
    return config.redis_wait_replicas


def replica_clock(config: ServiceConfig) -> Clock:
    """This replica's clock: the system's, or a deliberately skewed one (tests only)."""
    if config.test_clock_offset:
        log.warning(
            "MC_TEST_CLOCK_OFFSET is set: this replica's clock is %+.3fs off, for tests only",
            config.test_clock_offset,
        )
        return OffsetClock(int(config.test_clock_offset * 1000))
    return SystemClock()


async def open_backend(config: ServiceConfig, clock: Clock | None = None) -> Backend:
    """Open and touch the configured backend, or raise a StartupError."""
    name, hosts = config.backend, _host_count(config)
    where = f"the {name} backend ({hosts} host{'s' if hosts != 1 else ''})"
    try:
        async with asyncio.timeout(OPEN_TIMEOUT_S):
            backend = await _open(config, clock or SystemClock())
    except StartupError:
        raise
    except StoreSchemaError as exc:  # its texts are ours: they say what to run
        raise ConfigError(f"{where} is not ready for this version: {exc}") from None
    except StoreMisconfigured as exc:  # its texts are ours, and say what is wrong
        raise BackendUnreachable(
            f"cannot open {where}: {type(exc).__name__}: {exc}: {exc.operator_hint}"
        ) from None
    except StoreUnavailable as exc:
        hint = f": {exc.operator_hint}" if exc.operator_hint else ""
        raise BackendUnreachable(f"cannot open {where}: {type(exc).__name__}{hint}") from None
    except Exception as exc:  # fail closed on anything, naming the type only
        raise BackendUnreachable(f"cannot open {where}: {type(exc).__name__}") from None
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            await backend.store.readiness()
            await backend.outbox.readiness()
            if backend.delivery is not None:
                await backend.delivery.readiness()
    except Exception as exc:
        await backend.close()
        hint = getattr(exc, "operator_hint", "")
        hint = f": {hint}" if hint else ""
        raise BackendUnreachable(f"{where} does not answer: {type(exc).__name__}{hint}") from None
    if not backend.durable:
        log.warning(NOT_DURABLE_WARNING)
    log.info("backend %s opened (%d host(s))", name, hosts)
    return backend


def build_server(
    config: ServiceConfig,
    backend: Backend,
    *,
    clock: Clock | None = None,
    faults: FaultPoints | None = None,
    tracing: Tracing = OFF,
) -> CommitServer:
    """Wire one replica: metrics, the instrumented (and, tracing on, traced) store,
    the committer, the server."""
    clock = clock or SystemClock()
    metrics = ServiceMetrics()
    metrics.describe_backend(backend.name, backend.durable, backend.requests, backend.events)
    if backend.server_time is not None:  # the backend's clock decides, not this replica's
        clock = BackendClock(clock, backend.server_time)
        metrics.watch_clock_offset(clock.last_offset_ms)
    elif backend.clock_offset_ms is not None:
        metrics.watch_clock_offset(backend.clock_offset_ms)
    else:  # an in-process backend: its clock is this replica's
        metrics.watch_clock_offset(lambda: 0.0)
    backend = tracing.wrap_backend(backend)
    store = instrument(backend.store, metrics, tracing.store_span(backend.name))
    committer = MessageCommitter(
        store,
        backend.membership,
        backend.outbox,
        limits=config.limits(),
        faults=faults,
        clock=clock,
        observer=metrics,
        recovery=config.recovery_policy(),
    )
    relay = None
    if backend.delivery is not None and not backend.delivery.shared:
        # Nothing of this backend is visible to another process: its relay runs here.
        relay = RelayRunner(
            backend,
            policy=config.relay_policy(),
            idle_wait_s=config.relay_idle_wait,
            metrics=RelayMetrics(metrics.registry),
            clock=clock,
            faults=faults,
            shares_loop=True,  # the RPCs' loop: one partition step per loop turn
            busy_pause_s=config.relay_busy_pause,
        )
    return CommitServer(
        config,
        backend,
        committer,
        store,
        metrics,
        clock,
        interceptors=tracing.server_interceptors(),
        relay=relay,
    )


GC_THRESHOLDS = (10_000, 10, 10)
"""Young-generation threshold raised from CPython's 700: every commit allocates
short-lived protobuf, domain and driver objects, and the default made the
collector run every few commits (8-10 us of a ~300 us commit on memory,
~3 us with this setting, measured by the benchmark)."""


def tune_gc() -> None:
    """Freeze what start-up allocated and collect young objects less often.

    Called once a server is up (by ``serve`` and the benchmark): the frozen
    start-up objects (modules, stubs, config) are never scanned again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(config: ServiceConfig, tracing: Tracing = OFF) -> int:
    """Run until SIGTERM or SIGINT, then shut down gracefully; returns the exit code.

    ``tracing`` must be set up before (it instruments redis-py globally, so
    before the backend opens its client); the caller flushes it afterwards."""
    clock = replica_clock(config)
    backend = await open_backend(config, clock)
    server = build_server(config, backend, clock=clock, tracing=tracing)
    try:
        await server.start()
    except BaseException:
        await backend.close()
        raise
    tune_gc()
    log.info(
        "event loop %s, tracing %s",
        running_loop_name(),
        "on (OTLP)" if tracing.enabled else "off",
    )
    log.info(
        "serving gRPC on %s (port %d, %s), HTTP on port %d",
        config.grpc_address.rpartition(":")[0],
        server.grpc_port,
        "TLS" if config.tls_cert else "plaintext",
        server.http_port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("shutdown requested: draining for up to %.1fs", config.shutdown_grace)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
    return 0
