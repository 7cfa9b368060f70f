"""Fixtures of the client runtime tests: a restartable in-process server and clients.

``@pytest.mark.server(**options)`` passes ServiceConfig overrides to the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.client.support import TENANT, Client, MemoryServers, admin

NewClient = Callable[..., Client]


@pytest.fixture
async def servers(request: pytest.FixtureRequest) -> AsyncIterator[MemoryServers]:
    marker = request.node.get_closest_marker("server")
    s = MemoryServers(**(marker.kwargs if marker else {}))
    await s.start()
    async with await admin(s.target) as c:
        await c.create_conversation(TENANT, "general", ["alice", "bob", "carol"])
        await c.create_conversation(TENANT, "side", ["alice", "bob"])
    yield s
    await s.kill()


@pytest.fixture
async def new_client(tmp_path: Path, servers: MemoryServers) -> AsyncIterator[NewClient]:
    made: list[Client] = []

    def make(user: str, **options: Any) -> Client:
        client = Client(user, tmp_path / f"{user}.db", lambda: servers.target, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.crash()
