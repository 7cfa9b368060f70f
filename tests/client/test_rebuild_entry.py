"""The rebuild entry points are serialised and take only the cursor the expiry
named (issue 22, item 11)."""

from __future__ import annotations

import asyncio

import pytest

from client import (
    ClientRuntime,
    ConnectRequest,
    ExpiredCursor,
    GrpcConnector,
    MailboxCursor,
    RebuildFinished,
    RebuildNotAllowed,
    RuntimeStopped,
    in_memory_store_for_test,
)

EXPIRED = ExpiredCursor("inbox", 3, 40, "trimmed")


async def _runtime() -> ClientRuntime:
    store = in_memory_store_for_test()
    await store.begin_rebuild(EXPIRED, [], [], 1)  # a rebuild a crash interrupted
    runtime = ClientRuntime(store, GrpcConnector("127.0.0.1:1"))  # no server: it stays offline
    await runtime.connect(ConnectRequest("acme", "alice", "phone"))
    return runtime


async def test_finish_rebuild_takes_only_the_cursor_the_expiry_named() -> None:
    runtime = await _runtime()
    try:
        with pytest.raises(RebuildNotAllowed):
            await runtime.finish_rebuild(MailboxCursor("inbox", 3, 12))
        assert await runtime.store.cursor("inbox") is None
        assert await runtime.store.rebuilding() == [EXPIRED]
    finally:
        await runtime.close()


async def test_two_concurrent_finish_rebuild_calls_finish_it_once() -> None:
    runtime = await _runtime()
    try:
        cursor = MailboxCursor("inbox", 3, 40)
        first, second = await asyncio.gather(
            runtime.finish_rebuild(cursor), runtime.finish_rebuild(cursor), return_exceptions=True
        )
        outcomes = sorted(type(r).__name__ for r in (first, second))
        assert outcomes == ["NoneType", "RebuildNotAllowed"], (first, second)
        assert await runtime.store.cursor("inbox") == cursor
    finally:
        await runtime.close()
    finished = []
    for _ in range(1000):  # drained, then RuntimeStopped
        try:
            finished.append(await runtime.next_event())
        except RuntimeStopped:
            break
    assert len([e for e in finished if isinstance(e, RebuildFinished)]) == 1
