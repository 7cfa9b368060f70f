"""A relay that lags behind big messages still writes groups every Sync page can carry
(issue 23, item 2), through the product: commits over gRPC while no relay runs, then
the relay starts, then Sync pages through everything at ``max_bytes`` 1 MiB.

On memory the server is the real ``build_server`` in this process, its in-process
relay held back until the commits are in; on Redis ``serve`` and ``relay`` are real
subprocesses. Before the fix one relay step wrote the 70 messages as one group of
~4.2 MB and every Sync answered RESOURCE_EXHAUSTED ("Sent message larger than max").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import pytest

from backends.memory import open_memory_backend
from service.bootstrap import build_server
from service.client import CommitClient
from service.domain.mailbox import MailboxCursor
from service.domain.model import MessageContent, MessageType
from tests.e2e.conftest import BASE_CONFIG, FAST_RETRY
from tests.e2e.process import RelayProcess, ServeProcess
from tests.servers.redis_server import initialise_prefix
from tests.support import send, unique

pytestmark = pytest.mark.e2e

MESSAGES = 70
BODY_BYTES = 60_000
MAX_BYTES = 1 << 20
DEADLINE_S = 60.0


@dataclass
class Product:
    """A server (no relay yet) and how to start the relay."""

    client: CommitClient
    start_relay: Callable[[], None]


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.memory),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
async def product(request: pytest.FixtureRequest) -> AsyncIterator[Product]:
    if request.param == "memory":
        config = replace(BASE_CONFIG, relay_batch=100)
        server = build_server(config, open_memory_backend())
        runner, server.relay = server.relay, None  # held back: the commits land first
        assert runner is not None
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        await server.start()
        client = CommitClient.connect(f"127.0.0.1:{server.grpc_port}", retry=FAST_RETRY)

        def start_memory_relay() -> None:
            tasks.append(asyncio.create_task(runner.run(stop)))

        try:
            yield Product(client, start_memory_relay)
        finally:
            stop.set()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 10)
            await client.close()
            await server.stop(grace_s=0.5)
        return
    url: str = request.getfixturevalue("redis_url")
    prefix = unique("mc-groups")
    await initialise_prefix(url, prefix, shards=4)
    env = {"MC_SENDER_RATE_PER_S": "0", "MC_REDIS_URL": url, "MC_REDIS_PREFIX": prefix}
    serve = ServeProcess(["--backend", "redis"], env)
    relays: list[RelayProcess] = []
    client = CommitClient.connect(serve.target, retry=FAST_RETRY)

    def start_redis_relay() -> None:
        relays.append(RelayProcess(["--backend", "redis"], {**env, "MC_RELAY_BATCH": "100"}))

    try:
        yield Product(client, start_redis_relay)
    finally:
        await client.close()
        for process in relays:
            process.close()
        serve.close()


async def test_a_backlog_of_big_messages_pages_through_sync_within_max_bytes(
    product: Product,
) -> None:
    tenant = unique("t")
    client = product.client
    await client.create_conversation(tenant, "c1", ["alice", "bob"])
    for n in range(MESSAGES):
        body = MessageContent(MessageType.TEXT, bytes([65 + n % 26]) * BODY_BYTES)
        await client.commit(send(tenant, "c1", cmid=f"big-{n}", content=body))
    product.start_relay()

    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    seqs: list[int] = []
    cursor = MailboxCursor()
    for _ in range(10 * MESSAGES):  # pages, and waits for the relay
        page = await client.sync(tenant, "bob", cursor, max_bytes=MAX_BYTES)
        size = sum(e.size_bytes() for e in page.entries)
        assert size <= MAX_BYTES, f"a page of {size} bytes"
        assert all(len(e.record.content.body) == BODY_BYTES for e in page.entries)
        seqs += [e.record.seq for e in page.entries]
        cursor = page.next_cursor
        if len(seqs) >= MESSAGES:
            break
        if not page.more:
            assert loop.time() < deadline, f"only {len(seqs)} of {MESSAGES} delivered in time"
            await asyncio.sleep(0.1)
    assert seqs == list(range(1, MESSAGES + 1))
