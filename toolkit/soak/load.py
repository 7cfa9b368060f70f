"""The soak's clients: senders that commit through the replicas, readers that sync.

A sender picks a conversation and one of its members, commits a new message and
retries *the same key* on any error that is not a definite refusal, moving to the
next replica each time, until it has an ACK or ``send_deadline_s`` passed (then the
outcome is unknown: the ledger keeps the key, and ``resolve`` tries it again once
the faults stopped). A reader syncs each of a user's lanes (the inbox, and the lane
of every big conversation the user is in) from its cursor and records every entry
in ``Observations``; ``CURSOR_EXPIRED`` restarts the lane from the epoch and trim
watermark the answer names (a rebuild).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from service.api.errors import RequestTooLarge
from service.client import CommitClient, RetryPolicy
from service.domain.errors import (
    CommitAbandoned,
    ConversationNotFound,
    CursorExpired,
    IdempotencyConflict,
    InvalidRequest,
    NotAMember,
)
from service.domain.mailbox import INBOX, MailboxCursor, conversation_lane
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from toolkit.soak.ledger import Key, Ledger, Observations, Seen

ONE_ATTEMPT = RetryPolicy(max_attempts=1, attempt_timeout_s=5.0, deadline_s=5.0)
DEFINITE = (InvalidRequest, NotAMember, IdempotencyConflict, RequestTooLarge,
            ConversationNotFound, CommitAbandoned)  # fmt: skip
"""Refusals that say the send was not (and will not be) committed."""
MAX_PAGES = 10_000


@dataclass
class Clients:
    """One channel per serve replica, shared by every sender and reader."""

    tenant: str
    targets: list[str]
    clients: list[CommitClient] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def open(self) -> None:
        self.clients = [CommitClient.connect(t, retry=ONE_ATTEMPT) for t in self.targets]

    def pick(self, n: int) -> CommitClient:
        return self.clients[n % len(self.clients)]

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


@dataclass
class Senders:
    clients: Clients
    ledger: Ledger
    rng: random.Random
    send_deadline_s: float = 60.0
    pause_s: float = 0.02
    counts: Counter[str] = field(default_factory=Counter)
    sends: dict[Key, AuthenticatedSend] = field(default_factory=dict)

    async def run(self, index: int, stop: asyncio.Event) -> None:
        names = sorted(self.ledger.conversations)
        serial = 0
        while not stop.is_set():
            serial += 1
            conversation = self.ledger.conversations[self.rng.choice(names)]
            sender = self.rng.choice(sorted(conversation.members))
            body = f"soak {index}-{serial}".encode() * self.rng.choice((1, 1, 1, 20))
            send = AuthenticatedSend(
                self.clients.tenant, sender, f"d{index}", conversation.name,
                f"s{index}-{serial}", MessageContent(MessageType.TEXT, body),
            )  # fmt: skip
            await self.commit(send, index)
            await asyncio.sleep(self.pause_s)

    async def commit(self, send: AuthenticatedSend, first: int) -> bool:
        """True on an ACK; the ledger holds the outcome either way."""
        key: Key = (send.conversation, send.sender, send.cmid)
        self.sends[key] = send
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.send_deadline_s
        attempt = 0
        while True:
            try:
                ack = await self.clients.pick(first + attempt).commit(send)
            except DEFINITE as exc:
                self.counts[f"refused {type(exc).__name__}"] += 1
                if attempt > 0:  # an earlier attempt may have committed it
                    self.ledger.lost_track(key)
                return False
            except Exception as exc:
                self.clients.errors[f"commit {type(exc).__name__}"] += 1
                attempt += 1
                if loop.time() >= deadline:
                    self.ledger.lost_track(key)
                    self.counts["unknown"] += 1
                    return False
                self.counts["retries"] += 1
                await asyncio.sleep(min(0.05 * 2 ** min(attempt, 5), 1.0))
                continue
            self.ledger.ack(key, ack.message_id, time.monotonic())
            self.counts["acks"] += 1
            return True

    async def resolve(self) -> int:
        """Try every unknown send again (the same key); how many got their ACK."""
        settled = 0
        for n, key in enumerate(sorted(self.ledger.unknown)):
            if await self.commit(self.sends[key], n):
                settled += 1
        return settled


@dataclass
class Reader:
    """The lanes of one user, read from where this reader stands."""

    user: str
    lanes: list[str]
    clients: Clients
    observations: Observations
    cursors: dict[str, MailboxCursor] = field(default_factory=dict)
    rebuilds: int = 0

    @staticmethod
    def mailbox(user: str, lane: str) -> str:
        return f"inbox:{user}" if lane == INBOX else lane

    async def read_all(self, n: int) -> bool:
        """One pass over the lanes; False when a read failed (the next pass goes on)."""
        ok = True
        for lane in self.lanes:
            ok = await self.read_lane(lane, n) and ok
        return ok

    async def read_lane(self, lane: str, n: int) -> bool:
        cursor = self.cursors.get(lane, MailboxCursor(lane))
        client = self.clients.pick(n)
        mailbox = self.mailbox(self.user, lane)
        try:
            for _ in range(MAX_PAGES):
                try:
                    page = await client.sync(self.clients.tenant, self.user, cursor, limit=500)
                except CursorExpired as exc:
                    self.rebuilds += 1
                    cursor = MailboxCursor(lane, exc.epoch, exc.trim_watermark)
                    continue
                epoch = page.next_cursor.epoch
                for e in page.entries:
                    r = e.record
                    seen = Seen((r.conversation, r.sender, r.cmid), r.message_id)
                    self.observations.see(mailbox, epoch, e.seq, seen, time.monotonic())
                cursor = page.next_cursor
                if not page.more:
                    break
        except Exception as exc:  # a replica down: the next pass goes on from the cursor
            self.clients.errors[f"sync {type(exc).__name__}"] += 1
            self.cursors[lane] = cursor
            return False
        self.cursors[lane] = cursor
        return True


def readers(ledger: Ledger, clients: Clients, observations: Observations) -> list[Reader]:
    users = sorted({u for c in ledger.conversations.values() for u in c.members})
    found = []
    for user in users:
        lanes = [INBOX] + [
            conversation_lane(c.name)
            for c in sorted(ledger.conversations.values(), key=lambda c: c.name)
            if c.own_lane and user in c.members
        ]
        found.append(Reader(user, lanes, clients, observations))
    return found


def final_readers(ledger: Ledger, clients: Clients, observations: Observations) -> list[Reader]:
    """Fresh readers from the start of each lane's current epoch: every inbox once, every
    big conversation's lane once (through its first member)."""
    fresh = [Reader(r.user, [INBOX], clients, observations)
             for r in readers(ledger, clients, observations)]  # fmt: skip
    for c in sorted(ledger.conversations.values(), key=lambda c: c.name):
        if c.own_lane:
            lane = conversation_lane(c.name)
            fresh.append(Reader(sorted(c.members)[0], [lane], clients, observations))
    return fresh


async def reader_loop(reader: Reader, n: int, stop: asyncio.Event, pause_s: float) -> None:
    while not stop.is_set():
        await reader.read_all(n)
        n += 1
        await asyncio.sleep(pause_s)
