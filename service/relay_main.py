"""``message-committer relay``: the outbox relay as a process of its own.

    MC_REDIS_URL=redis://127.0.0.1:6379/0 message-committer relay --backend redis

Reads the same configuration as ``serve`` (``service.config``: flags, then
``MC_*`` variables, then defaults) and uses its backend and relay settings
(``MC_RELAY_*``, ``MC_FANOUT_THRESHOLD``, ``MC_MAILBOX_*``); settings only a
server uses (the gRPC address, TLS, limits) are accepted and ignored. Any
number of relays may run against one Redis or Scylla backend: they share the
outbox partitions by leases (``service.relay_runner``). On the memory backend,
whose data lives in one ``serve`` process, the relay runs inside ``serve``
and this command refuses (exit 2).

The HTTP side port (``MC_RELAY_HTTP_ADDRESS``) serves /metrics, /healthz and
/readyz (ready while the last lease round reached the backend). SIGTERM or
SIGINT: every lease is released after the current step, so other relays
take over at once; exit 0. Start-up fails closed like ``serve`` (exit 2 bad
configuration, 3 backend unreachable).

Its "now" (a message's age against the dedupe window, retry due times) is the
backend's where the backend has a clock (Redis ``TIME``), measured at start and
every ``MC_READINESS_INTERVAL``, as serve's is: a relay whose own clock is off
warns and still agrees with the replicas that stamped the messages.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from service import config as service_config
from service.backend_clock import BackendClock
from service.config import ConfigError, ServiceConfig, StartupError, split_address
from service.domain.ports import Clock
from service.health import Readiness
from service.httpside import HttpSide
from service.metrics import backend_events
from service.relay_metrics import RELAY_LOGGER, RelayMetrics
from service.relay_runner import RelayRunner

log = logging.getLogger(RELAY_LOGGER)
PROG = "message-committer relay"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Deliver committed messages from the outbox into mailboxes. Takes the"
        " same flags and MC_* variables as serve; the relay uses the backend, MC_RELAY_*,"
        " MC_FANOUT_THRESHOLD and MC_MAILBOX_* settings.",
    )
    service_config.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        config = service_config.load(vars(args), os.environ)
        if config.backend == "memory":
            raise ConfigError(
                "the memory backend shares nothing between processes: its relay runs"
                " inside serve; use redis or scylla for separate relays"
            )
    except StartupError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if config.log_level.upper() != "DEBUG":
        logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    try:
        return asyncio.run(run(config))
    except StartupError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code


def _readiness(runner: RelayRunner, backend: str) -> Readiness:
    if runner.ready:
        return Readiness(True, f"ready: relaying {len(runner.held)} partition(s) of {backend}")
    return Readiness(False, f"{backend} backend not ready (no lease round reached it)")


async def run(config: ServiceConfig) -> int:
    """Relay until SIGTERM or SIGINT; returns the exit code."""
    from service.bootstrap import open_backend, replica_clock

    own = replica_clock(config)
    backend = await open_backend(config, own)
    # A message's age is judged against the time the replica that committed it took:
    # the backend's, where it has one (Redis), as serve does (service/backend_clock.py).
    synced = BackendClock(own, backend.server_time) if backend.server_time else None
    if synced is not None:
        await synced.try_sync()
    clock: Clock = synced or own
    metrics = RelayMetrics()
    metrics.registry.register(backend_events(backend.events))
    runner = RelayRunner(
        backend,
        policy=config.relay_policy(),
        idle_wait_s=config.relay_idle_wait,
        metrics=metrics,
        clock=clock,
    )
    http = HttpSide(metrics.registry, lambda: _readiness(runner, backend.name))
    host, port = split_address(config.relay_http_address, "MC_RELAY_HTTP_ADDRESS")
    try:
        http_port = await http.start(host, port)
    except OSError:
        await backend.close()
        raise ConfigError(
            "cannot listen on MC_RELAY_HTTP_ADDRESS/--relay-http-address (in use or not local)"
        ) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "relaying as %s on the %s backend (%d partitions), HTTP on port %d",
        runner.owner,
        backend.name,
        len(backend.delivery.partitions.partitions()) if backend.delivery else 0,
        http_port,
    )
    resync = (
        asyncio.create_task(synced.run(stop, config.readiness_interval), name="backend-clock")
        if synced is not None
        else None
    )
    try:
        await runner.run(stop)
        log.info("stopped: leases released")
    finally:
        if resync is not None:
            stop.set()
            await resync
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await http.close()
        await backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
