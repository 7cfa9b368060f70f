"""cancel_and_wait and wait_event: a caller's own cancellation is never lost."""

from __future__ import annotations

import asyncio

import pytest

from service.tasks import cancel_and_wait, wait_event


async def _slow_to_stop(stopping: asyncio.Event, release: asyncio.Event) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        stopping.set()
        await release.wait()  # its cleanup takes a while


async def test_a_caller_cancelled_while_waiting_for_its_child_stays_cancelled() -> None:
    stopping, release, after = asyncio.Event(), asyncio.Event(), []

    async def parent() -> None:
        child = asyncio.create_task(_slow_to_stop(stopping, release))
        await asyncio.sleep(0)
        try:
            await cancel_and_wait(child)
        finally:
            release.set()
        after.append("carried on")  # what the suppress() pattern did: the bug

    task = asyncio.create_task(parent())
    await asyncio.wait_for(stopping.wait(), 5)
    task.cancel()  # arrives while the parent waits for the child's cleanup
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert after == []


async def test_the_childs_own_end_is_consumed() -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    failing = asyncio.create_task(fails())
    await asyncio.sleep(0.01)
    await cancel_and_wait(failing)  # finished with an error: retrieved, not raised
    running = asyncio.create_task(asyncio.sleep(10))
    await cancel_and_wait(running)
    assert running.cancelled()


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, 0) is True


async def test_a_cancel_that_arrives_as_the_event_is_set_is_not_lost() -> None:
    """Python 3.11's wait_for loses this one (cpython#86296): the caller carries on."""
    event, after = asyncio.Event(), []

    async def waiter() -> None:
        await wait_event(event, 10)
        after.append("carried on")

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()  # the same loop step: the wait completes as the cancel arrives
    with pytest.raises(asyncio.CancelledError):
        await task
    assert after == []
