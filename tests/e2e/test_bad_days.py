"""Bad days against real ``serve`` processes and a real redis-server (issue "bad days").

* a Redis that evicts is refused at start-up (exit 3, a line that says why);
* a Redis that loses its data under a running server (FLUSHALL) turns it
  NOT_SERVING within two readiness intervals, as grpc-health-probe sees it,
  and nothing is re-initialised behind the operator's back;
* a replica whose clock is days ahead retries a committed send through the
  same Redis and gets the original ACK (Redis's TIME decides, not a replica);
* an undecodable intent is quarantined, listed, shown and retried with the
  ``message-committer quarantine`` commands, and never stops readiness;
* ``serve --help`` says that conditional writes on Scylla use SERIAL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest
from redis import Redis

from service.client import CommitClient
from service.domain.model import Direction, HistoryQuery
from tests.e2e.conftest import tool
from tests.e2e.process import ServeProcess, run_cli
from tests.servers.redis_server import RedisServer
from tests.support import send, text, unique

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

INTERVAL_S = 0.2


def _serve_redis(
    server: RedisServer, *extra: str, env: dict[str, str] | None = None
) -> ServeProcess:
    return ServeProcess(
        ["--backend", "redis", "--readiness-interval", f"{int(INTERVAL_S * 1000)}ms", *extra],
        env={"MC_REDIS_URL": server.url, **(env or {})},
    )


def _probe(target: str) -> subprocess.CompletedProcess[str]:
    probe = tool("grpc-health-probe")
    if probe is None:
        pytest.fail("grpc-health-probe is not installed: run scripts/install-tools.sh")
    return subprocess.run(
        [probe, "-addr", target], capture_output=True, text=True, timeout=30, check=False
    )


def test_an_evicting_redis_is_refused_at_start_up(own_redis_server: RedisServer) -> None:
    with Redis.from_url(own_redis_server.url) as admin:
        admin.config_set("maxmemory-policy", "allkeys-lru")
    started = run_cli(
        ["serve", "--backend", "redis", "--grpc-address", "127.0.0.1:0",
         "--http-address", "127.0.0.1:0"],
        env={"MC_REDIS_URL": own_redis_server.url},
    )  # fmt: skip
    assert started.returncode == 3, started.stderr
    assert "maxmemory-policy is allkeys-lru" in started.stderr
    assert "noeviction" in started.stderr and own_redis_server.url not in started.stderr
    allowed = _serve_redis(own_redis_server, env={"MC_REDIS_ALLOW_EVICTION": "true"})
    try:
        assert "MC_REDIS_ALLOW_EVICTION is set" in allowed.log()
    finally:
        allowed.close()


def test_a_flushall_turns_the_server_not_serving_within_two_intervals(
    own_redis_server: RedisServer,
) -> None:
    serve = _serve_redis(own_redis_server)
    try:
        assert _probe(serve.target).returncode == 0
        with Redis.from_url(own_redis_server.url) as admin:
            admin.flushall()
        flushed = time.monotonic()
        while time.monotonic() - flushed < 2 * INTERVAL_S + 1.0:  # + the probe's own start
            if _probe(serve.target).returncode != 0:
                break
        probed = _probe(serve.target)
        assert probed.returncode != 0 and "NOT_SERVING" in probed.stdout + probed.stderr
        seen_after = time.monotonic() - flushed
        assert seen_after < 2 * INTERVAL_S + 2.0
        health = run_cli(["health", "--target", serve.target])
        assert "NOT_SERVING" in health.stdout + health.stderr
        with Redis.from_url(own_redis_server.url) as admin:
            assert admin.dbsize() == 0  # refused, not silently re-initialised
        assert "deployment identity is missing or different" in serve.log()
    finally:
        serve.close()
    started = run_cli(
        ["serve", "--backend", "redis", "--grpc-address", "127.0.0.1:0",
         "--http-address", "127.0.0.1:0"],
        env={"MC_REDIS_URL": own_redis_server.url},
    )  # fmt: skip
    assert started.returncode == 2 and "migrate --backend redis" in started.stderr


def test_a_replica_days_ahead_keeps_the_original_ack(own_redis_server: RedisServer) -> None:
    right = _serve_redis(own_redis_server)
    ahead = _serve_redis(own_redis_server, "--test-clock-offset", "3d")
    try:
        assert "clock is +259200.000s off" in ahead.log()
        tenant = unique("t")

        async def scenario() -> None:
            async with (
                CommitClient.connect(right.target) as a,
                CommitClient.connect(ahead.target) as b,
            ):
                await a.create_conversation(tenant, "c1", ["alice", "bob"])
                request = send(tenant, content=text("first"))
                first = await a.commit(request)
                assert await b.commit(request) == first  # release 1 re-reserved it: seq 2
                later = await b.commit(send(tenant, content=text("later")))
                assert later.seq == 2
                page = await b.history(_history(tenant))  # a fast clock trims nothing early
                assert [r.seq for r in page.records] == [1, 2]
                assert await a.commit(request) == first

        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        right.close()
        ahead.close()


def _history(tenant: str) -> HistoryQuery:
    return HistoryQuery(tenant, "c1", "bob", Direction.FORWARD)


def test_an_undecodable_intent_is_quarantined_listed_and_retried(
    own_redis_server: RedisServer,
) -> None:
    serve = _serve_redis(own_redis_server, "--recovery-interval", "200ms", "--recovery-grace", "0s")
    tenant = unique("t")
    request = send(tenant, cmid="poison-1")
    try:

        async def create() -> None:
            async with CommitClient.connect(serve.target) as client:
                await client.create_conversation(tenant, "c1", ["alice", "bob"])
                await client.commit(send(tenant, cmid="fine-1"))

        asyncio.run(create())
        _write_unfinished_with_a_newer_message_type(own_redis_server.url, tenant, request.cmid)
        deadline = time.monotonic() + 20
        listed = run_cli(["quarantine", "list", "--target", serve.target])
        while request.cmid not in listed.stdout and time.monotonic() < deadline:
            time.sleep(0.2)
            listed = run_cli(["quarantine", "list", "--target", serve.target])
        assert listed.returncode == 0 and f"{tenant}/alice/{request.cmid}" in listed.stdout
        assert "quarantined" in listed.stdout and "state=undecodable" in listed.stdout
        assert _probe(serve.target).returncode == 0  # one bad intent never blocks readiness
        shown = run_cli(
            ["quarantine", "show", "--target", serve.target, "--json", "--tenant", tenant,
             "--sender", "alice", "--cmid", request.cmid]
        )  # fmt: skip
        item = json.loads(shown.stdout)
        assert item["quarantined"] and not item["decodable"] and item["problem"] == "StoreCorrupt"
        retried = run_cli(
            ["quarantine", "retry", "--target", serve.target, "--tenant", tenant,
             "--sender", "alice", "--cmid", request.cmid]
        )  # fmt: skip
        assert retried.returncode == 1 and "COMMIT_RECOVERABLE" not in retried.stdout
        assert "UNAVAILABLE Recoverable" in retried.stderr  # still undecodable: never an ACK
        metrics = _scrape(serve)
        assert "message_committer_quarantined_intents" in metrics
    finally:
        serve.close()


def _scrape(serve: ServeProcess) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{serve.http}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def _write_unfinished_with_a_newer_message_type(url: str, tenant: str, cmid: str) -> None:
    """An unfinished intent as a newer release could write it: a message type this
    release does not know. Written by hand, with its queue entries."""
    from backends.redis.keys import KeySpace

    keys = KeySpace("mc", 8)
    conv = keys.conversation(tenant, "c1")
    record = b'{"i":"01a22a20-5697-7d07-b8d6-97d3bdc60000","u":"alice","d":"phone",'
    record += b'"k":"' + cmid.encode() + b'","y":"hologram","b":"aGk=","t":1}'
    member = keys.queue_member(tenant, "c1", "alice", cmid)
    with Redis.from_url(url) as raw:
        seq = raw.hincrby(conv.meta, "s", 1)
        raw.hset(
            conv.commit("alice", cmid),
            mapping={"st": "0", "id": b"QIMD\x01" + b"\x00" * 32, "r": record, "s": seq,
                     "m": "01a22a20-5697-7d07-b8d6-97d3bdc60000", "t": 1, "d": '{"v":1}',
                     "ca": 1},
        )  # fmt: skip
        raw.hset(keys.pointer(tenant, "alice", cmid).pointer, "c", "c1")
        raw.zadd(conv.pinned, {str(seq): seq})
        raw.zadd(conv.shard.queue, {member: 1})
        raw.zadd(conv.shard.created, {member: 1})


def test_serve_help_says_scylla_uses_serial() -> None:
    helped = run_cli(["serve", "--help"])
    assert helped.returncode == 0
    flat = " ".join(helped.stdout.split())
    assert "--scylla-single-dc-conversations" in flat
    assert "SERIAL (the default)" in flat
