"""``message-committer quarantine abandon`` against a real ``serve`` and a real
redis-server (issue 24 item 7): an intent no decoder can take, written as bytes
a newer release could write, is quarantined; the operator abandons it; its key
then answers COMMIT_ABANDONED, History names its seq as a permanent gap, the
retention pin is gone, and the audit is in the log without the body."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import Redis

from backends.redis.keys import KeySpace
from service.client import CommitClient
from service.domain.errors import CommitAbandoned
from service.domain.model import Direction, HistoryQuery
from tests.e2e.process import ServeProcess, run_cli
from tests.e2e.test_bad_days import _write_unfinished_with_a_newer_message_type
from tests.servers.redis_server import RedisServer
from tests.support import send, unique

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def _key_args(tenant: str, cmid: str) -> list[str]:
    return ["--tenant", tenant, "--sender", "alice", "--cmid", cmid]


def test_an_operator_abandons_a_quarantined_intent_with_the_cli(
    own_redis_server: RedisServer,
) -> None:
    serve = ServeProcess(
        ["--backend", "redis", "--recovery-interval", "200ms", "--recovery-grace", "0s"],
        env={"MC_REDIS_URL": own_redis_server.url},
    )
    tenant = unique("t")
    poison = send(tenant, cmid="poison-1")
    try:

        async def before() -> list[int]:
            async with CommitClient.connect(serve.target) as client:
                await client.create_conversation(tenant, "c1", ["alice", "bob"])
                first = await client.commit(send(tenant, cmid="fine-1"))
                _write_unfinished_with_a_newer_message_type(
                    own_redis_server.url, tenant, poison.cmid
                )
                last = await client.commit(send(tenant, cmid="fine-2"))
                return [first.seq, last.seq]

        assert asyncio.run(asyncio.wait_for(before(), 60)) == [1, 3]
        deadline = time.monotonic() + 20
        listed = run_cli(["quarantine", "list", "--target", serve.target])
        while poison.cmid not in listed.stdout and time.monotonic() < deadline:
            time.sleep(0.2)
            listed = run_cli(["quarantine", "list", "--target", serve.target])
        assert f"{tenant}/alice/{poison.cmid}" in listed.stdout

        abandon = ["quarantine", "abandon", "--target", serve.target]
        refused = run_cli([*abandon, *_key_args(tenant, "fine-1"), "--reason", "wrong key"])
        assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr
        assert "no quarantined intent" in refused.stderr
        why = ["--reason", "written by a newer release", "--operator", "ops-anna"]
        done = run_cli([*abandon, *_key_args(tenant, poison.cmid), *why])
        assert done.returncode == 0, done.stderr
        assert "abandoned=now" in done.stdout and "seq=2" in done.stdout
        assert "operator=ops-anna" in done.stdout
        again = run_cli([*abandon, *_key_args(tenant, poison.cmid), "--reason", "twice"])
        assert again.returncode == 0 and "abandoned=before" in again.stdout
        assert "reason=written by a newer release" in again.stdout  # the first audit record

        conv = KeySpace("mc", 8).conversation(tenant, "c1")
        with Redis.from_url(own_redis_server.url) as raw:
            assert raw.zrange(conv.pinned, 0, -1) == []  # retention is no longer pinned
            assert raw.zrange(conv.gaps, 0, -1) == [b"2"]
            tomb = raw.hgetall(conv.commit("alice", poison.cmid))
            assert tomb[b"st"] == b"A" and b"r" not in tomb  # the undecodable bytes are gone

        async def after() -> None:
            async with CommitClient.connect(serve.target) as client:
                with pytest.raises(CommitAbandoned):  # definite, never Recoverable again
                    await client.commit(poison)
                page = await client.history(HistoryQuery(tenant, "c1", "bob", Direction.FORWARD))
                assert [r.seq for r in page.records] == [1, 3]
                assert page.abandoned_seqs == (2,)

        asyncio.run(asyncio.wait_for(after(), 60))
        listed = run_cli(["quarantine", "list", "--target", serve.target])
        assert poison.cmid not in listed.stdout
        history = run_cli(
            ["history", "--target", serve.target, "--tenant", tenant, "--conversation", "c1",
             "--actor", "bob", "--direction", "forward"]
        )  # fmt: skip
        assert "abandoned_seqs=2" in history.stdout, history.stderr
        log = serve.log()
        audit = f"abandoned a quarantined intent: tenant={tenant} sender=alice cmid=poison-1"
        assert "WARNING" in log and audit in log and "operator ops-anna" in log
        assert "hologram" not in log and "aGk=" not in log  # never the body
    finally:
        serve.close()
