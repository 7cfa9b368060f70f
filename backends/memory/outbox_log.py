"""The memory outbox's entries: by position, and one queue per partition.

A position is the publication's number (the n-th publish, from 1; never
reused). The log is cut into ``PARTITIONS`` partitions by conversation
(``crc32(tenant:conversation)``, computed once, at publish), so all entries of
one conversation are in one partition, in publication order. Each partition
queues the positions nobody claimed yet; an entry leaves the log when the
relay settles it as sent or dead-lettered (a dead letter keeps its own copy),
so the log holds only what is still to deliver, and each operation costs what
it touches, not what was delivered before (issue 27). A publish rings only the
waiters of its own partition.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from service.domain.model import OutboxEntry

PARTITIONS = 4
NAMES = tuple(f"memory:{n}" for n in range(PARTITIONS))


def partition_of(tenant: str, conversation: str) -> str:
    key = f"{len(tenant)}:{tenant}:{conversation}".encode()
    return NAMES[zlib.crc32(key) % PARTITIONS]


@dataclass
class OutboxLog:
    """What the memory outbox holds, and who waits for it."""

    published: int = 0
    """The last position handed out."""
    entries: dict[int, OutboxEntry] = field(default_factory=dict)
    """Every entry not settled yet, by position, in position order (insertion order)."""
    queues: dict[str, deque[int]] = field(default_factory=lambda: {n: deque() for n in NAMES})
    """Per partition, the positions published and not claimed yet, in order."""
    waiters: dict[str, set[asyncio.Event]] = field(
        default_factory=lambda: {n: set() for n in NAMES}
    )

    def next_position(self) -> int:
        self.published += 1
        return self.published

    def add(self, position: int, entry: OutboxEntry) -> None:
        """Queue ``entry`` on its partition and ring that partition's waiters."""
        partition = partition_of(entry.tenant, entry.conversation)
        self.entries[position] = entry
        self.queues[partition].append(position)
        for event in self.waiters[partition]:
            event.set()

    def drop(self, position: str) -> None:
        """A settled entry leaves the log."""
        self.entries.pop(int(position), None)

    def entry(self, position: str) -> OutboxEntry:
        return self.entries[int(position)]

    def after(self, position: int) -> Iterator[OutboxEntry]:
        """The entries after ``position``, in order (for tests and tools: the
        log holds only the undelivered ones, so this is bounded by them)."""
        return (e for p, e in self.entries.items() if p > position)

    def __len__(self) -> int:
        return len(self.entries)
