"""How fast one client runtime drains a queue of pending sends (issue 22, item 9).

``python -m toolkit.client_drain --sends 100 --sends 5000 [--server ack]``
queues each number
of sends in a fresh SQLite store (as ``send_message`` writes them while
offline), starts a runtime against an in-process server (memory backend, its
relay inside) and times from the first ``SendConfirmed`` to the last (so the
connection's setup is not in the figure). It
prints one line per size and the ratio of the rates: a linear drain keeps
the rate of a big queue near the rate of a small one.

``--server memory`` (the default) is the real server; its figure includes the
server's own cost per commit, which grows with the conversation on the memory
backend. ``--server ack`` answers every call at once in process (each Commit
acked with the next seq, empty Sync pages, heartbeats): the figure is the
runtime and its SQLite store alone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from client import (
    ClientRuntime,
    ConnectRequest,
    RuntimeStopped,
    SendConfirmed,
    open_local_store,
)
from client.model import (
    ConversationPage,
    Heartbeat,
    LeftConversationPage,
    MailboxCursor,
    MailboxPage,
)
from client.transport import CallTimeouts, Connector, ServerApi, StreamItem
from service.client import CommitClient, ExistingSend, RetryPolicy
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    HistoryPage,
    HistoryQuery,
    MemberPage,
    MessageContent,
    MessageType,
)
from toolkit.client_campaign.host import LateTarget
from toolkit.client_campaign.servers import MemoryServers

TENANT, USER, DEVICE, CONVERSATION = "bench", "alice", "phone", "drain"
DRAIN_TIMEOUT_S = 1800.0


class AckingApi(ServerApi):
    """A server that acks every Commit at once (the runtime's own cost only)."""

    def __init__(self) -> None:
        self.seq = 0

    async def wait_ready(self) -> None:
        return None

    async def commit(self, send: AuthenticatedSend) -> CommittedMessage:
        self.seq += 1
        message_id = f"00000000-0000-7000-8000-{self.seq:012x}"
        return CommittedMessage(send.conversation, send.cmid, message_id, self.seq, 1)

    async def find_existing(self, send: AuthenticatedSend) -> ExistingSend:
        return ExistingSend(None, 0)

    async def history(self, query: HistoryQuery) -> HistoryPage:
        return HistoryPage(query.conversation, query.direction, query.anchor_seq, 0, (), 0, 0)

    async def list_members(
        self, tenant: str, conversation: str, page_size: int, page_token: str
    ) -> MemberPage:
        raise NotImplementedError("not used by a drain")

    async def list_conversations(
        self, tenant: str, user: str, page_size: int, page_token: str
    ) -> ConversationPage:
        return ConversationPage(())

    async def list_left_conversations(
        self, tenant: str, user: str, left_after_ms: int, page_size: int, page_token: str
    ) -> LeftConversationPage:
        return LeftConversationPage(())

    async def sync(self, tenant: str, user: str, cursor: MailboxCursor, limit: int) -> MailboxPage:
        return MailboxPage(cursor.lane, (), MailboxCursor(cursor.lane, 1, cursor.seq))

    async def subscribe(
        self, tenant: str, user: str, heartbeat_s: int
    ) -> AsyncIterator[StreamItem]:
        for _ in range(1_000_000):
            yield Heartbeat(0)
            await asyncio.sleep(heartbeat_s)

    async def close(self) -> None:
        return None


@dataclass
class Acking:
    api: AckingApi = field(default_factory=AckingApi)

    def open(self, timeouts: CallTimeouts) -> ServerApi:
        return self.api


async def drain_rate(sends: int, directory: Path, server: str = "memory") -> float:
    """Sends per second confirmed when ``sends`` queued sends drain."""
    servers = MemoryServers()
    await servers.start()
    try:
        retry = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, deadline_s=10.0)
        async with CommitClient.connect(servers.target, retry=retry) as admin:
            await admin.create_conversation(TENANT, CONVERSATION, [USER, "bob"])
        connector: Connector = Acking() if server == "ack" else LateTarget(lambda: servers.target)
        account = ConnectRequest(TENANT, USER, DEVICE)
        store = await open_local_store(directory / f"drain-{sends}.sqlite3")
        await store.bind_account(account)
        for i in range(sends):
            body = MessageContent(MessageType.TEXT, f"queued {i}".encode())
            send = AuthenticatedSend(TENANT, USER, DEVICE, CONVERSATION, f"q-{i}", body)
            await store.persist_pending(send, int(time.time() * 1000))
        runtime = ClientRuntime(store, connector)
        await runtime.connect(account)
        confirmed = 0
        first = 0.0
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                while confirmed < sends:
                    if isinstance(await runtime.next_event(), SendConfirmed):
                        confirmed += 1
                        first = first or time.perf_counter()
        except RuntimeStopped:
            raise SystemExit("the runtime stopped before the queue drained") from None
        elapsed = time.perf_counter() - first
        await runtime.close()
        return (sends - 1) / elapsed
    finally:
        await servers.kill()


async def _main(sizes: Sequence[int], server: str) -> int:
    rates: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="client-drain-") as tmp:
        for n in sizes:
            rates[n] = await drain_rate(n, Path(tmp), server)
            print(f"server {server}: drained {n} queued sends: {rates[n]:.0f} sends/s", flush=True)
    if len(rates) > 1:
        small, big = min(rates), max(rates)
        print(f"rate({big}) / rate({small}) = {rates[big] / rates[small]:.2f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="client-drain", description=__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, action="append", help="queue sizes [100, 5000]")
    p.add_argument("--server", choices=("memory", "ack"), default="memory")
    args = p.parse_args(argv)
    return asyncio.run(_main(args.sends or [100, 5000], args.server))


if __name__ == "__main__":
    sys.exit(main())
