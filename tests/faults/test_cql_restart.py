"""The CQL node is killed under load while ``serve --backend scylla`` keeps running.

The test starts its own Apache Cassandra 5.0 node with ``commitlog_sync:
batch`` (a write is acknowledged only once its commit log is fsynced), so
the fault can be a kill -9; the node comes back on the same ports and data.
(A graceful stop and start of a node is ``tests/scylla/test_restart.py``; the
3-node cluster's kills and partitions are the nemesis's.) 16 clients commit through
the real CLI subprocess on a keyspace made by ``message-committer migrate``;
the service must turn NOT_SERVING while the node is down and SERVING again
once it is back. Half of the keys in flight at the fault are abandoned; a
RecoverDue RPC finishes them; every key ever sent is sent again, and the
keyspace is read back directly.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from service.client import CommitClient
from tests.e2e.process import run_cli
from tests.faults.load import LoadDriver
from tests.faults.scenario import (
    READER,
    create_conversations,
    plan,
    scylla_backend,
    start_batch_node,
)
from tests.faults.support import Report, Service, observe, unfinished, verify
from tests.servers.cql_server import Node
from tests.support import unique

pytestmark = [pytest.mark.slow, pytest.mark.scylla, pytest.mark.own_cql]  # its own node

WORKERS = 16
ACKS_PER_PHASE = 80
MIN_IN_FLIGHT = WORKERS // 2
PHASE_TIMEOUT_S = 90.0
NODE_START_TIMEOUT_S = 180.0
HEALTH_DOWN_TIMEOUT_S = 20.0
HEALTH_UP_TIMEOUT_S = 60.0


async def test_cql_node_kill_and_restart_under_load_lose_nothing(tmp_path: Path) -> None:
    report = Report("CQL node kill -9 (commitlog batch), then start")
    began = time.monotonic()
    node = await asyncio.to_thread(start_batch_node, tmp_path / "node")
    report.seconds["node_start"] = round(time.monotonic() - began, 2)
    try:
        keyspace = f"mcf_{uuid.uuid4().hex[:16]}"
        migrate = ["migrate", "--contact-points", node.host, "--port", str(node.port)]
        migrated = await asyncio.to_thread(run_cli, [*migrate, "--keyspace", keyspace])
        assert migrated.returncode == 0, migrated.stderr
        await _run(report, node, keyspace)
    finally:
        await asyncio.to_thread(node.kill)
    report.seconds["total"] = round(time.monotonic() - began, 2)
    report.print()

    assert report.problems == []
    assert all(f.in_flight > 0 for f in report.faults)
    assert sum(f.unfinished_after for f in report.faults) > 0, "no fault cut a commit short"
    assert report.recovered == report.unfinished_before_recovery
    assert report.unfinished_before_recovery >= sum(f.left_to_recovery for f in report.faults)


async def _run(report: Report, node: Node, keyspace: str) -> None:
    tenant = unique("t")
    open_backend = scylla_backend(node.host, node.port, keyspace)
    env = {
        "MC_SCYLLA_CONTACT_POINTS": node.host,
        "MC_SCYLLA_PORT": str(node.port),
        "MC_SCYLLA_KEYSPACE": keyspace,
        "MC_RECOVERY_INTERVAL": "1h",  # recovery is the RecoverDue call below
    }
    faults: list[tuple[str, Callable[[], None]]] = [("CQL node kill -9", node.kill)]
    began = time.monotonic()
    async with Service(["--backend", "scylla"], env) as service:
        await service.start()
        await create_conversations(service, tenant)
        async with LoadDriver(service.target, plan(tenant, workers=WORKERS)) as driver:
            for what, fault in faults:
                await driver.wait_more_acks(
                    ACKS_PER_PHASE, PHASE_TIMEOUT_S, min_in_flight=MIN_IN_FLIGHT
                )
                in_flight = driver.in_flight
                downed = time.monotonic()
                await asyncio.to_thread(fault)
                abandoned = driver.abandon(0.5)
                phases = {"stop": time.monotonic() - downed}
                phases["to_not_serving"] = await service.wait_health(
                    "NOT_SERVING", HEALTH_DOWN_TIMEOUT_S
                )
                started = time.monotonic()
                await asyncio.to_thread(node.start, NODE_START_TIMEOUT_S)
                phases["node_start"] = time.monotonic() - started
                phases["to_serving"] = await service.wait_health("SERVING", HEALTH_UP_TIMEOUT_S)
                down_s = round(time.monotonic() - downed, 2)
                record = await observe(what, in_flight, abandoned, open_backend)
                record.down_s = down_s
                record.phases = {name: round(s, 2) for name, s in phases.items()}
                report.faults.append(record)

            await driver.wait_more_acks(
                ACKS_PER_PHASE, PHASE_TIMEOUT_S, what="ACKs after the restart"
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
        if problems:
            print(service.logs())
    assert service.kills == 0 and service.starts == 1  # the service rode it out
