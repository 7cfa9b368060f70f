"""kill -9 of redis-server (AOF, appendfsync always) under load, twice, while the
``serve`` process keeps running.

24 clients commit through the real CLI subprocess. At each fault redis-server
is SIGKILLed, the service must turn NOT_SERVING, and redis-server comes back
on the same port and data directory; the service must turn SERVING again by
itself. Half of the keys in flight at each fault are abandoned; the
service's own recovery loop (300 ms interval, 1 s grace) finishes them. Then
every key ever sent is sent again and the backend is read back directly: no
ACKed commit may be lost, since every write was fsynced before Redis replied.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.load import LoadDriver
from tests.faults.scenario import READER, create_conversations, plan, redis_backend
from tests.faults.support import Report, Service, observe, verify, wait_all_committed
from tests.servers.redis_server import RedisServer, initialise_prefix
from tests.support import unique

pytestmark = [pytest.mark.slow, pytest.mark.redis]

RESTARTS = 2
WORKERS = 24
ACKS_PER_PHASE = 400
MIN_IN_FLIGHT = WORKERS // 2
PHASE_TIMEOUT_S = 60.0
DOWN_S = 1.0
HEALTH_TIMEOUT_S = 15.0
RECOVERY_TIMEOUT_S = 20.0


async def test_redis_kill_9_under_load_loses_no_acked_commit(
    own_redis_server: RedisServer,
) -> None:
    report = Report("redis-server kill -9 + restart (appendfsync always)")
    redis = own_redis_server
    tenant, prefix = unique("t"), unique("mc-faults")
    await initialise_prefix(own_redis_server.url, prefix)  # serve refuses an empty prefix
    open_backend = redis_backend(redis.url, prefix)
    env = {
        "MC_REDIS_URL": redis.url,
        "MC_REDIS_PREFIX": prefix,
        "MC_RECOVERY_INTERVAL": "300ms",
        "MC_RECOVERY_GRACE": "1s",
    }
    began = time.monotonic()
    async with Service(["--backend", "redis"], env) as service:
        await service.start()
        await create_conversations(service, tenant)
        async with LoadDriver(service.target, plan(tenant, workers=WORKERS)) as driver:
            for cycle in range(1, RESTARTS + 1):
                await driver.wait_more_acks(
                    ACKS_PER_PHASE, PHASE_TIMEOUT_S, min_in_flight=MIN_IN_FLIGHT
                )
                in_flight = driver.in_flight
                killed = time.monotonic()
                await asyncio.to_thread(redis.kill)
                abandoned = driver.abandon(0.5)
                phases = {"kill": time.monotonic() - killed}
                phases["to_not_serving"] = await service.wait_health(
                    "NOT_SERVING", HEALTH_TIMEOUT_S
                )
                await asyncio.sleep(DOWN_S)  # the clients keep trying against a dead Redis
                assert await service.health() == "NOT_SERVING"
                started = time.monotonic()
                await asyncio.to_thread(redis.start)  # same port, same data directory
                phases["redis_start"] = time.monotonic() - started
                phases["to_serving"] = await service.wait_health("SERVING", HEALTH_TIMEOUT_S)
                down_s = round(time.monotonic() - killed, 2)
                fault = await observe(
                    f"redis-server kill -9 #{cycle}", in_flight, abandoned, open_backend
                )
                fault.down_s = down_s
                fault.phases = {name: round(s, 2) for name, s in phases.items()}
                report.faults.append(fault)

            await driver.wait_more_acks(
                ACKS_PER_PHASE, PHASE_TIMEOUT_S, what="ACKs after the restarts"
            )
            await driver.stop()
            report.seconds["load"] = round(time.monotonic() - began, 2)

            report.seconds["recovery_wait"] = round(
                await wait_all_committed(open_backend, RECOVERY_TIMEOUT_S), 2
            )
            recovered = await service.metric("message_committer_recovered_intents_total")
            report.recovered = int(recovered)
            settled = time.monotonic()
            await driver.settle()
            report.seconds["settle"] = round(time.monotonic() - settled, 2)
            async with open_backend() as backend:
                problems = await verify(backend, driver.log, READER)
            report.finish(driver, problems)
        logs = service.logs()
    report.seconds["total"] = round(time.monotonic() - began, 2)
    report.print()

    assert problems == [], logs
    assert service.kills == 0 and service.starts == 1  # the service rode it out
    assert all(f.in_flight > 0 for f in report.faults)
    unavailable = sum(n for label, n in driver.log.errors.items() if label.startswith("UNAV"))
    assert unavailable + driver.client_retries > 0, "no client noticed Redis was down"
    assert report.recovered >= sum(f.left_to_recovery for f in report.faults)
