"""One fail-closed gate (issue 24 item 2): what turns readiness NOT_SERVING also
refuses writes, for every client, whether or not it watches health."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2
from redis.asyncio import Redis

from service.api import convert, errors
from service.bootstrap import build_server, open_backend
from service.client import CommitClient
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc, membership_pb2_grpc
from service.gen.message_committer.v1 import membership_pb2 as mpb
from tests.e2e.conftest import BASE_CONFIG, health_watch, http_get
from tests.redis.conftest import snapshot
from tests.servers.redis_server import RedisServer, initialise_prefix
from tests.support import send, unique

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
MAX_POLLS = 600


async def test_an_eviction_policy_set_at_run_time_refuses_writes_not_just_health(
    own_redis_server: RedisServer,
) -> None:
    config = replace(
        BASE_CONFIG,
        backend="redis",
        redis_url=own_redis_server.url,
        redis_prefix=unique("mc-gate"),
        readiness_interval=0.1,
        readiness_timeout=5.0,
    )
    await initialise_prefix(config.redis_url, config.redis_prefix)
    backend = await open_backend(config)
    server = build_server(config, backend)
    await server.start()
    target = f"127.0.0.1:{server.grpc_port}"
    admin = Redis.from_url(own_redis_server.url)
    try:
        async with CommitClient.connect(target) as client, aio.insecure_channel(target) as channel:
            await client.create_conversation("t1", "c1", ["alice", "bob"])
            await client.commit(send("t1", cmid="before"))
            stream = aiter(health_watch(channel)(health_pb2.HealthCheckRequest()))
            assert (await anext(stream)).status == SERVING

            await admin.config_set("maxmemory-policy", "allkeys-lru")
            assert (await asyncio.wait_for(anext(stream), 30)).status == NOT_SERVING
            # NOT_SERVING may first be a slow probe (a loaded machine); the gate closes
            # on the probe that sees the policy, which /readyz names.
            readyz = f"http://127.0.0.1:{server.http_port}/readyz"
            for _ in range(MAX_POLLS):
                if "maxmemory-policy" in (await http_get(readyz))[1]:
                    break
                await asyncio.sleep(0.05)
            assert "maxmemory-policy" in (await http_get(readyz))[1]
            before = await snapshot(admin, config.redis_prefix)
            commits = committer_pb2_grpc.MessageCommitterServiceStub(channel)
            request = pb.CommitRequest(send=convert.send_to_proto(send("t1", cmid="during")))
            with pytest.raises(aio.AioRpcError) as refused:
                await commits.Commit(request, timeout=10)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "maxmemory-policy" in (refused.value.details() or "")
            details = errors.parse_details(refused.value.trailing_metadata())  # type: ignore[arg-type]
            assert details.reason == "FAIL_CLOSED"
            members = membership_pb2_grpc.ConversationMembershipServiceStub(channel)
            with pytest.raises(aio.AioRpcError) as refused_too:
                await members.CreateConversation(
                    mpb.CreateConversationRequest(
                        tenant="t1", conversation="c2", members=["alice"]
                    ),
                    timeout=10,
                )
            assert refused_too.value.code() is grpc.StatusCode.UNAVAILABLE
            assert await snapshot(admin, config.redis_prefix) == before  # nothing written

            await admin.config_set("maxmemory-policy", "noeviction")
            for _ in range(MAX_POLLS):  # the next successful probe opens the gate
                if (await http_get(readyz))[0] == 200:
                    break
                await asyncio.sleep(0.05)
            await commits.Commit(request, timeout=10)  # open again
    finally:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.aclose()
        await server.stop(grace_s=0.5)
