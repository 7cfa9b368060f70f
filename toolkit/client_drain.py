"""How fast one client runtime drains a queue of pending sends (issue 22, item 9).

``python -m toolkit.client_drain --sends 100 --sends 5000`` queues each number
of sends in a fresh SQLite store (as ``send_message`` writes them while
offline), starts a runtime against an in-process server (memory backend, its
relay inside) and times from the first ``SendConfirmed`` to the last (so the
connection's setup is not in the figure). It
prints one line per size and the ratio of the rates: a linear drain keeps
the rate of a big queue near the rate of a small one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from client import (
    ClientRuntime,
    ConnectRequest,
    RuntimeConfig,
    RuntimeStopped,
    SendConfirmed,
    open_local_store,
)
from service.client import CommitClient, RetryPolicy
from service.domain.model import AuthenticatedSend, MessageContent, MessageType
from toolkit.client_campaign.host import LateTarget
from toolkit.client_campaign.servers import MemoryServers

TENANT, USER, DEVICE, CONVERSATION = "bench", "alice", "phone", "drain"
DRAIN_TIMEOUT_S = 1800.0


async def drain_rate(sends: int, directory: Path) -> float:
    """Sends per second confirmed when ``sends`` queued sends drain."""
    servers = MemoryServers()
    await servers.start()
    try:
        retry = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, deadline_s=10.0)
        async with CommitClient.connect(servers.target, retry=retry) as admin:
            await admin.create_conversation(TENANT, CONVERSATION, [USER, "bob"])
        account = ConnectRequest(TENANT, USER, DEVICE)
        store = await open_local_store(directory / f"drain-{sends}.sqlite3")
        await store.bind_account(account)
        for i in range(sends):
            body = MessageContent(MessageType.TEXT, f"queued {i}".encode())
            send = AuthenticatedSend(TENANT, USER, DEVICE, CONVERSATION, f"q-{i}", body)
            await store.persist_pending(send, int(time.time() * 1000))
        runtime = ClientRuntime(store, LateTarget(lambda: servers.target, RuntimeConfig()))
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


async def _main(sizes: Sequence[int]) -> int:
    rates: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="client-drain-") as tmp:
        for n in sizes:
            rates[n] = await drain_rate(n, Path(tmp))
            print(f"drained {n} queued sends: {rates[n]:.0f} sends/s", flush=True)
    if len(rates) > 1:
        small, big = min(rates), max(rates)
        print(f"rate({big}) / rate({small}) = {rates[big] / rates[small]:.2f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="client-drain", description=__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, action="append", help="queue sizes [100, 5000]")
    args = p.parse_args(argv)
    return asyncio.run(_main(args.sends or [100, 5000]))


if __name__ == "__main__":
    sys.exit(main())
