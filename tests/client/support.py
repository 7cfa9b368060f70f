"""Real servers and real runtimes for the client tests.

``MemoryServers`` (``toolkit.client_campaign.servers``) runs one in-process
replica on a memory state that outlives it, so a test can kill the server
and start it again on the same port with every commit still there. ``Client``
is a ``ClientHost``: one runtime over a SQLite file with a recorder of its
events; ``crash`` drops it without a word to the server and ``restart``
opens a new runtime on the same file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from client import ClientRuntime, ConnectionState, RuntimeConfig, SendMessage
from service.client import CommitClient, RetryPolicy
from service.domain.errors import CursorExpired
from service.domain.mailbox import MailboxCursor
from service.domain.model import Direction, HistoryQuery, MessageContent, MessageRecord, MessageType
from toolkit.client_campaign.host import TENANT, ClientHost
from toolkit.client_campaign.servers import FAST_SERVER, MemoryServers

__all__ = ["TENANT", "MemoryServers"]

SERVER_CONFIG = FAST_SERVER
FAST = RuntimeConfig(
    ack_timeout_s=3.0,
    rpc_timeout_s=3.0,
    heartbeat_s=1,
    pong_timeout_s=3.0,
    reconnect_initial_s=0.02,
    reconnect_max_s=0.2,
)
ADMIN_RETRY = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, deadline_s=10.0)


def text(body: str) -> MessageContent:
    return MessageContent(MessageType.TEXT, body.encode())


async def admin(target: str) -> CommitClient:
    return CommitClient.connect(target, retry=ADMIN_RETRY)


async def history(
    target: str, conversation: str, actor: str, tenant: str = TENANT
) -> list[MessageRecord]:
    """Every record of a conversation, oldest first, read from the server."""
    records: list[MessageRecord] = []
    async with CommitClient.connect(target, retry=ADMIN_RETRY) as c:
        anchor = 0
        for _ in range(1000):
            page = await c.history(
                HistoryQuery(tenant, conversation, actor, Direction.FORWARD, anchor, 200)
            )
            records += page.records
            if not page.next_anchor:
                return records
            anchor = page.next_anchor
    raise AssertionError("history did not end")


async def sync_expired(target: str, tenant: str, user: str, cursor: MailboxCursor) -> bool:
    """Whether the server answers a Sync from ``cursor`` with CURSOR_EXPIRED."""
    async with await admin(target) as c:
        try:
            await c.sync(tenant, user, cursor, limit=1)
        except CursorExpired:
            return True
    return False


async def lane_head(target: str, tenant: str, user: str, lane: str) -> int:
    """The seq of the newest entry the server holds in ``lane`` (its current epoch)."""
    cursor = MailboxCursor(lane)
    async with await admin(target) as c:
        for _ in range(3):  # the start may be trimmed, or in an older epoch: ask again
            try:
                return (await c.sync(tenant, user, cursor, limit=1)).head
            except CursorExpired as exc:
                cursor = MailboxCursor(lane, exc.epoch, exc.trim_watermark)
    raise AssertionError(f"the lane {lane!r} kept expiring under a fresh cursor")


class Client(ClientHost):
    """A ClientHost with the tests' fast settings and a few conveniences."""

    def __init__(self, user: str, path: Path, target: Callable[[], str], **options: Any) -> None:
        options.setdefault("config", FAST)
        super().__init__(user, path, target, **options)

    async def send(self, conversation: str, body: str, cmid: str | None = None) -> str:
        message = SendMessage(conversation, text(body))
        if cmid:
            message = replace(message, cmid=cmid)
        return (await self.rt.send_message(message)).cmid

    async def online(self, timeout_s: float = 15.0) -> None:
        await eventually(lambda: _is(self.runtime, ConnectionState.ONLINE), timeout_s)


async def _is(runtime: ClientRuntime | None, state: ConnectionState) -> bool:
    return runtime is not None and runtime.state is state


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    """Wait until ``check()`` is true (polling every 20 ms), or fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout_s}s")
