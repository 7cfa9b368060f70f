"""Health (Check and Watch), /readyz, /metrics, reflection, recovery and shutdown, in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from service.domain.errors import IdempotencyConflict, NotAMember
from service.domain.faults import FaultPoint
from service.domain.model import HistoryQuery
from service.health import DETAIL_KEY
from service.server import COMMITTER_SERVICE, MEMBERSHIP_SERVICE
from tests.e2e.conftest import (
    Running,
    StartServer,
    eventually,
    health_check,
    health_watch,
    http_get,
    reflection_info,
)
from tests.support import send, text
from toolkit.campaign.faulty import CallFault

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _watch(channel: aio.Channel, service: str = "") -> AsyncIterator[int]:
    call = health_watch(channel)(health_pb2.HealthCheckRequest(service=service))
    async for response in call:
        yield response.status


async def _next(stream: AsyncIterator[int]) -> int:
    return await asyncio.wait_for(anext(stream), timeout=5.0)


async def test_health_follows_a_real_readiness_probe(running: Running) -> None:
    async with aio.insecure_channel(running.target) as channel:
        check = health_check(channel)
        watch = _watch(channel)
        assert await _next(watch) == SERVING
        status, body = await http_get(running.http + "/readyz")
        assert status == 200 and "not durable" in body

        running.fail_readiness()
        assert await _next(watch) == NOT_SERVING
        for service in ("", COMMITTER_SERVICE, MEMBERSHIP_SERVICE):
            call = check(health_pb2.HealthCheckRequest(service=service))
            assert (await call).status == NOT_SERVING
            trailers = dict(await call.trailing_metadata() or ())
            assert trailers[DETAIL_KEY] == "memory backend not ready (StoreUnavailable)"
        status, body = await http_get(running.http + "/readyz")
        assert (status, body) == (503, "memory backend not ready (StoreUnavailable)\n")
        assert (await http_get(running.http + "/healthz"))[0] == 200  # alive all the same

        running.heal()
        assert await _next(watch) == SERVING
        assert (await http_get(running.http + "/readyz"))[0] == 200
        with pytest.raises(aio.AioRpcError) as unknown:
            await check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert unknown.value.code() is grpc.StatusCode.NOT_FOUND


async def test_graceful_shutdown_drains_in_flight_rpcs(running: Running) -> None:
    client = running.client
    await client.create_conversation("t1", "c1", ["alice", "bob"])
    running.store.faults.hang_s = 1.0
    running.store.inject("put_record", CallFault.HANG)  # applied, then the reply takes 1 s
    async with aio.insecure_channel(running.target) as channel:
        watch = _watch(channel)
        assert await _next(watch) == SERVING
        in_flight = asyncio.create_task(client.commit(send("t1", cmid="slow")))
        await eventually(lambda: _started(running, "Commit"))
        stopping = asyncio.create_task(running.server.stop(grace_s=5.0))
        assert await _next(watch) == NOT_SERVING  # health flips first
        await channel.close()  # an open Watch would otherwise hold the stop for the full grace
        status, body = await http_get(running.http + "/readyz")
        assert (status, body) == (503, "shutting down\n")
        ack = await in_flight  # the in-flight commit still finishes
        assert ack.cmid == "slow"
        await asyncio.wait_for(stopping, 3.0)  # well within the grace: nothing else in flight
    with pytest.raises(aio.AioRpcError):
        async with aio.insecure_channel(running.target) as late:
            await health_check(late)(health_pb2.HealthCheckRequest(), timeout=1.0)


async def _started(running: Running, method: str) -> bool:
    families = {f.name: f for f in text_string_to_metric_families(await _metrics(running))}
    return any(
        s.labels.get("grpc_method") == method and s.value >= 1
        for s in families["grpc_server_started"].samples
    )


async def _metrics(running: Running) -> str:
    status, body = await http_get(running.http + "/metrics")
    assert status == 200
    return body


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert found, f"{name}{labels} missing"
    return sum(found)


async def test_metrics_endpoint_exports_every_series(running: Running) -> None:
    client = running.client
    await client.create_conversation("t1", "c1", ["alice", "bob"])
    await client.commit(send("t1", cmid="m-1"))
    await client.commit(send("t1", cmid="m-1"))
    with pytest.raises(IdempotencyConflict):
        await client.commit(send("t1", cmid="m-1", content=text("other")))
    with pytest.raises(NotAMember):
        await client.commit(send("t1", cmid="m-2", sender="mallory"))
    running.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(Exception, match="INTERNAL"):
        await client.commit(send("t1", cmid="m-3"))
    running.backend.requests["redis_call"] += 3  # read at scrape time

    async def aged() -> bool:
        families = text_string_to_metric_families(await _metrics(running))
        gauge = next(f for f in families if f.name.endswith("oldest_recoverable_age_seconds"))
        return gauge.samples[0].value > 0

    await eventually(aged)
    assert (await client.recover_due()).committed == 1

    families = {f.name: f for f in text_string_to_metric_families(await _metrics(running))}
    samples = [s for f in families.values() for s in f.samples]
    commit = {"grpc_service": COMMITTER_SERVICE, "grpc_method": "Commit"}
    assert _value(samples, "grpc_server_started_total", **commit) == 5
    assert _value(samples, "grpc_server_handled_total", grpc_code="OK", **commit) == 2
    assert _value(samples, "grpc_server_handled_total", grpc_code="ALREADY_EXISTS", **commit) == 1
    assert (
        _value(samples, "grpc_server_handled_total", grpc_code="PERMISSION_DENIED", **commit) == 1
    )
    assert _value(samples, "grpc_server_handled_total", grpc_code="INTERNAL", **commit) == 1
    assert families["grpc_server_handling_seconds"].type == "histogram"
    assert _value(samples, "grpc_server_handling_seconds_count", **commit) == 5
    assert _value(samples, "message_committer_commits_total", outcome="committed") == 2
    assert _value(samples, "message_committer_commits_total", outcome="replayed") == 1
    assert _value(samples, "message_committer_commits_total", outcome="conflict") == 1
    assert _value(samples, "message_committer_commits_total", outcome="rejected") == 1
    assert _value(samples, "message_committer_commits_total", outcome="recoverable") == 0
    assert _value(samples, "message_committer_rejections_total", reason="not_member") == 1
    assert _value(samples, "message_committer_recovery_runs_total") >= 1
    assert _value(samples, "message_committer_recovered_intents_total") == 1
    assert families["message_committer_backend_operation_seconds"].type == "histogram"
    assert (
        _value(samples, "message_committer_backend_operation_seconds_count", operation="reserve")
        >= 3
    )
    assert _value(samples, "message_committer_backend_requests_total", kind="redis_call") == 3
    assert _value(samples, "message_committer_backend_info", backend="memory", durable="false") == 1
    assert "message_committer_oldest_recoverable_age_seconds" in families
    assert _value(samples, "message_committer_ready") == 1
    assert all("alice" not in str(s.labels) for s in samples)  # no ids in labels


async def test_http_side_routes(running: Running) -> None:
    assert await http_get(running.http + "/healthz") == (200, "ok\n")
    assert (await http_get(running.http + "/nope"))[0] == 404


async def test_two_servers_keep_separate_metrics(start_server: StartServer) -> None:
    one, two = await start_server(), await start_server()
    await one.client.create_conversation("t1", "c1", ["alice"])
    one_text, two_text = await _metrics(one), await _metrics(two)
    assert 'grpc_method="CreateConversation"' in one_text
    assert 'grpc_method="CreateConversation"' not in two_text


async def test_reflection_lists_the_services(running: Running) -> None:
    async with aio.insecure_channel(running.target) as channel:
        call = reflection_info(channel)(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = set()
        async for response in call:
            names |= {s.name for s in response.list_services_response.service}
    assert {
        COMMITTER_SERVICE,
        MEMBERSHIP_SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


async def test_the_recovery_loop_finishes_abandoned_commits(start_server: StartServer) -> None:
    running = await start_server(recovery_interval=0.05, recovery_grace=0.0)
    client = running.client
    await client.create_conversation("t1", "c1", ["alice", "bob"])
    running.faults.arm(FaultPoint.AFTER_RESERVE)
    with pytest.raises(Exception, match="INTERNAL"):
        await client.commit(send("t1", cmid="lost"))
    query = HistoryQuery(tenant="t1", conversation="c1", actor="bob")

    async def recovered() -> bool:
        return [r.cmid for r in (await client.history(query)).records] == ["lost"]

    await eventually(recovered)
