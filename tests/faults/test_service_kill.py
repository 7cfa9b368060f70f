"""kill -9 of the ``serve`` process under concurrent load, three times, on Redis with AOF always.

24 clients commit through the real CLI subprocess. At each kill half of the
keys in flight are abandoned (their clients "died too"), the others retry
through the restart on the same port. After the last restart the load stops,
a RecoverDue RPC finishes what was left, every key ever sent is sent again,
and the backend is read back directly.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from service.client import CommitClient
from tests.faults.load import LoadDriver
from tests.faults.scenario import READER, create_conversations, plan, redis_backend
from tests.faults.support import Report, Service, observe, unfinished, verify
from tests.servers.redis_server import RedisServer, initialise_prefix
from tests.support import unique

pytestmark = [pytest.mark.slow, pytest.mark.redis]

KILLS = 3
WORKERS = 24
ACKS_PER_PHASE = 400
MIN_IN_FLIGHT = WORKERS // 2
PHASE_TIMEOUT_S = 60.0
RESTART_TIMEOUT_S = 30.0


async def test_kill_9_of_the_service_under_load_loses_and_doubles_nothing(
    own_redis_server: RedisServer,
) -> None:
    report = Report("serve kill -9 (redis, appendfsync always)")
    tenant, prefix = unique("t"), unique("mc-faults")
    await initialise_prefix(own_redis_server.url, prefix)  # serve refuses an empty prefix
    open_backend = redis_backend(own_redis_server.url, prefix)
    env = {
        "MC_REDIS_URL": own_redis_server.url,
        "MC_REDIS_PREFIX": prefix,
        "MC_RECOVERY_INTERVAL": "1h",  # recovery is the RecoverDue call below
    }
    began = time.monotonic()
    async with Service(["--backend", "redis"], env) as service:
        await service.start()
        await create_conversations(service, tenant)
        async with LoadDriver(service.target, plan(tenant, workers=WORKERS)) as driver:
            for cycle in range(1, KILLS + 1):
                await driver.wait_more_acks(
                    ACKS_PER_PHASE, PHASE_TIMEOUT_S, min_in_flight=MIN_IN_FLIGHT
                )
                in_flight = driver.in_flight
                killed = time.monotonic()
                service.kill()
                abandoned = driver.abandon(0.5)
                fault = await observe(f"serve kill -9 #{cycle}", in_flight, abandoned, open_backend)
                await asyncio.sleep(0.3)  # the clients meet a closed port for a while
                await service.start()
                await service.wait_health("SERVING", RESTART_TIMEOUT_S)
                fault.down_s = round(time.monotonic() - killed, 2)
                report.faults.append(fault)

            await driver.wait_more_acks(
                ACKS_PER_PHASE, PHASE_TIMEOUT_S, what="ACKs after the restarts"
            )
            await driver.stop()
            report.seconds["load"] = round(time.monotonic() - began, 2)

            report.unfinished_before_recovery = len(await unfinished(open_backend))
            async with CommitClient.connect(service.target) as admin:
                report.recovered = (await admin.recover_due(0, 10_000)).committed
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
    assert service.kills == KILLS and service.starts == KILLS + 1
    assert all(f.in_flight > 0 for f in report.faults)
    assert sum(f.unfinished_after for f in report.faults) > 0, "no kill cut a commit short"
    assert report.recovered == report.unfinished_before_recovery
    assert report.unfinished_before_recovery >= sum(f.left_to_recovery for f in report.faults)
