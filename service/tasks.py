"""Waiting and stopping without losing a cancellation (Python 3.11's asyncio).

Two patterns lose the caller's own cancellation, and whoever cancelled it then
waits forever for a coroutine that carries on:

* ``task.cancel()`` then ``with suppress(CancelledError): await task``, when
  the caller is cancelled during that await (``ClientRuntime.close`` hung on
  it: the connection cycle was cancelled while it waited for its Subscribe
  reader in a ``finally``, swallowed it, and reconnected);
* ``asyncio.wait_for`` in 3.11, when the awaited thing completes just as the
  caller is cancelled (cpython#86296, fixed in 3.12 by rebuilding
  ``wait_for`` on ``asyncio.timeout``).

``cancel_and_wait`` and ``wait_event`` do the same jobs without either race.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended. Its own outcome (cancelled, an
    error) is consumed; a cancellation of the caller meanwhile propagates."""
    task.cancel()
    await asyncio.wait({task})  # raises only when the caller itself is cancelled
    if not task.cancelled():
        task.exception()  # retrieved: never reported as "exception was never retrieved"


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout_s``; whether it is set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
