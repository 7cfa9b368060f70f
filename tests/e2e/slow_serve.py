"""``python -m tests.e2e.slow_serve serve ...``: the real CLI on a slow memory backend.

Identical to ``message-committer`` except that writing the record (``put_record``,
or the pipelined finish that starts with it) takes ``SLOW_S`` seconds in
conversation "slow", so a test can have an RPC in flight when it sends SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import backends.memory as memory
from backends.memory.members import MemoryMembershipStore
from service.cli import main
from service.domain.model import CommitIntent, CommittedMessage
from service.domain.ports import Backend, Outbox

SLOW_S = 1.5
STARTED = "slow record write: started"
"""Written to stderr (the process log) as the slow record write begins."""


async def _slow(intent: CommitIntent) -> None:
    if intent.conversation == "slow":
        print(STARTED, file=sys.stderr, flush=True)
        await asyncio.sleep(SLOW_S)


class SlowStore(memory.MemoryMessageStore):
    async def put_record(self, intent: CommitIntent) -> None:
        await _slow(intent)
        await super().put_record(intent)

    async def finish_pipelined(
        self, intent: CommitIntent, outbox: Outbox, steps: int = 3
    ) -> CommittedMessage | None:
        await _slow(intent)
        return await super().finish_pipelined(intent, outbox, steps)


def open_slow_backend(*args: Any, **kwargs: Any) -> Backend:
    backend = original_open(*args, **kwargs)
    fast = backend.store
    assert isinstance(fast, memory.MemoryMessageStore)
    assert isinstance(backend.membership, MemoryMembershipStore)
    backend.store = SlowStore(fast.state, backend.membership, fast._settings, fast._clock)
    return backend


original_open = memory.open_memory_backend


if __name__ == "__main__":
    memory.open_memory_backend = open_slow_backend
    sys.exit(main())
