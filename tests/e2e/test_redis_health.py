"""Health follows a real Redis going away and coming back; start-up fails closed without it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2

from service.bootstrap import BackendUnreachable, build_server, open_backend
from service.client import CommitClient
from service.domain.model import HistoryQuery
from tests.e2e.conftest import BASE_CONFIG, health_watch, http_get
from tests.servers.redis_server import RedisServer, initialise_prefix
from tests.support import send, unique

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_health_follows_redis_down_and_up(own_redis_server: RedisServer) -> None:
    config = replace(
        BASE_CONFIG,
        backend="redis",
        redis_url=own_redis_server.url,
        redis_prefix=unique("mc-e2e"),
        readiness_interval=0.1,
        readiness_timeout=0.5,
    )
    await initialise_prefix(config.redis_url, config.redis_prefix)
    backend = await open_backend(config)
    assert backend.durable
    server = build_server(config, backend)
    await server.start()
    target = f"127.0.0.1:{server.grpc_port}"
    try:
        async with CommitClient.connect(target) as client, aio.insecure_channel(target) as channel:
            await client.create_conversation("t1", "c1", ["alice", "bob"])
            ack = await client.commit(send("t1", cmid="before"))
            stream = aiter(health_watch(channel)(health_pb2.HealthCheckRequest()))
            assert (await anext(stream)).status == SERVING
            status, body = await http_get(f"http://127.0.0.1:{server.http_port}/readyz")
            assert (status, body) == (200, "ready: redis backend answers\n")

            await asyncio.to_thread(own_redis_server.stop)
            assert (await asyncio.wait_for(anext(stream), 10)).status == NOT_SERVING
            status, body = await http_get(f"http://127.0.0.1:{server.http_port}/readyz")
            assert status == 503 and body.startswith("redis backend not ready (")
            assert "127.0.0.1" not in body and "redis://" not in body

            await asyncio.to_thread(own_redis_server.start)
            assert (await asyncio.wait_for(anext(stream), 10)).status == SERVING
            assert await client.commit(send("t1", cmid="before")) == ack  # durable replay
            page = await client.history(HistoryQuery(tenant="t1", conversation="c1", actor="bob"))
            assert [r.cmid for r in page.records] == ["before"]
    finally:
        await server.stop(grace_s=0.5)


async def test_start_up_fails_closed_when_redis_is_down(own_redis_server: RedisServer) -> None:
    url = own_redis_server.url
    await asyncio.to_thread(own_redis_server.stop)
    config = replace(BASE_CONFIG, backend="redis", redis_url=url)
    with pytest.raises(BackendUnreachable) as caught:
        await open_backend(config)
    assert caught.value.exit_code == 3
    assert str(caught.value) == "cannot open the redis backend (1 host): StoreUnavailable"
