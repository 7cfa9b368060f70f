"""Stopping a child task without losing a cancellation of our own.

``task.cancel()`` followed by ``with suppress(CancelledError): await task``
swallows the *caller's* cancellation too when it arrives during that await:
the caller then carries on as if nobody had asked it to stop, and whoever
cancelled it waits for it forever. (That is how ``ClientRuntime.close``
hung: the connection cycle was cancelled while it waited for its Subscribe
reader in a ``finally``, swallowed it, and reconnected.)
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
