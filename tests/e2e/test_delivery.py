"""Delivery end to end, over real gRPC, with real processes (issue 15's "done when").

Two ``serve`` replicas and two ``relay`` replicas run as subprocesses on one
backend (Redis, and the CQL node). Workers commit through both servers, one
send at a time per conversation, failing over when a server is gone. During
the load: kill -9 of a relay (a third one starts), kill -9 of a server, and a
relay frozen (SIGSTOP) past its lease and let go again. Before the relays
start, a "ghost" relay (this test, through the backend's own port) claims a
partition's entries and stalls: once the relays take the partition over with
a newer fencing token, the ghost can record nothing.

Then: every ACKed message is in every frozen recipient's mailbox exactly
once, in conversation-seq order; a big conversation's messages are in its
own lane, once each; a chatty conversation's inboxes were trimmed by
retention, so a cursor from the start gets CURSOR_EXPIRED, and history plus
the mailbox after the trim watermark give every message back exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from grpc import aio

from service.bootstrap import open_backend
from service.client import CommitClient, RetryPolicy
from service.config import ServiceConfig
from service.domain.delivery import AppendRequest
from service.domain.errors import CommitError, CursorExpired, LeaseLost
from service.domain.mailbox import Mailbox, MailboxCursor, MailboxItem
from service.domain.model import AuthenticatedSend, Direction, HistoryQuery
from service.domain.ports import Backend
from service.domain.relay import Lease, PartitionEntry, Settlement
from tests.e2e.process import RelayProcess, ServeProcess
from tests.faults.load import CHANNEL_OPTIONS
from tests.servers.redis_server import initialise_prefix
from tests.support import send, unique

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LEASE_S = {"redis": 2.0, "scylla": 6.0}
"""Scylla renews by LWT, slower on a loaded two-core machine: a longer lease."""
THRESHOLD = 5
MAX_ENTRIES = 40
RELAY_BATCH = 8
"""A group is what one relay append wrote, and the newest group is never trimmed for
the count: small batches keep a caught-up backlog from landing as one untrimmable group."""
REGULAR = 5  # conversations of 3 members, each user in one
PER_CONVERSATION = 24
CHATTY = 60  # > MAX_ENTRIES + RELAY_BATCH: its inboxes are trimmed
DEADLINE_S = 120.0
ATTEMPT = RetryPolicy(max_attempts=2, attempt_timeout_s=2.0, deadline_s=4.0)


@dataclass
class Stack:
    """The backend of one test run: how the processes reach it, and a direct connection."""

    name: str
    args: list[str]
    env: dict[str, str]
    config: ServiceConfig
    secrets: tuple[str, ...] = ()
    """Texts no log line may carry (the backend's address)."""


@dataclass
class Acks:
    by_conversation: dict[str, list[tuple[int, str]]] = field(default_factory=dict)

    def add(self, conversation: str, seq: int, message_id: str) -> None:
        self.by_conversation.setdefault(conversation, []).append((seq, message_id))

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.by_conversation.values())


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("scylla", marks=pytest.mark.scylla),
    ]
)
async def stack(request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    common = {"MC_SENDER_RATE_PER_S": "0", "MC_RECOVERY_INTERVAL": "1s", "MC_RECOVERY_GRACE": "1s"}
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        prefix = unique("mc-e2e")
        await initialise_prefix(url, prefix, shards=8)
        env = {**common, "MC_REDIS_URL": url, "MC_REDIS_PREFIX": prefix}
        config = ServiceConfig(backend="redis", redis_url=url, redis_prefix=prefix)
        address = url.split("//", 1)[-1].rsplit("/", 1)[0]
        yield Stack("redis", ["--backend", "redis"], env, config, (url, address))
        return
    host, port = request.getfixturevalue("cql_contact")
    keyspace: str = request.getfixturevalue("cql_keyspace")
    env = {
        **common,
        "MC_SCYLLA_CONTACT_POINTS": host,
        "MC_SCYLLA_PORT": str(port),
        "MC_SCYLLA_KEYSPACE": keyspace,
    }
    config = ServiceConfig(
        backend="scylla", scylla_contact_points=(host,), scylla_port=port, scylla_keyspace=keyspace
    )
    yield Stack("scylla", ["--backend", "scylla"], env, config, (f"{host}:{port}",))


def _relay_env(stack: Stack) -> dict[str, str]:
    return {
        **stack.env,
        "MC_RELAY_LEASE": f"{LEASE_S[stack.name]}s",
        "MC_RELAY_IDLE_WAIT": "200ms",
        "MC_RELAY_FIRST_RETRY": "200ms",
        "MC_FANOUT_THRESHOLD": str(THRESHOLD),
        "MC_MAILBOX_MAX_ENTRIES": str(MAX_ENTRIES),
        "MC_RELAY_BATCH": str(RELAY_BATCH),
        "MC_RELAY_SETTLE_WINDOW": "3s",
    }


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _commit(clients: list[CommitClient], request: AuthenticatedSend, acks: Acks) -> None:
    """Send until ACKed, failing over between the servers (bounded in time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    turn = 0
    while True:
        client = clients[turn % len(clients)]
        try:
            ack = await client.commit(request)
            acks.add(ack.conversation, ack.seq, ack.message_id)
            return
        except CommitError:
            if loop.time() > deadline:
                raise
            turn += 1
            await asyncio.sleep(0.05)


async def _worker(
    clients: list[CommitClient],
    tenant: str,
    conversation: str,
    senders: list[str],
    count: int,
    acks: Acks,
) -> None:
    for n in range(count):
        request = send(
            tenant, conversation, sender=senders[n % len(senders)], cmid=f"{conversation}-{n}"
        )
        await _commit(clients[n % 2 :] + clients[: n % 2], request, acks)
        await asyncio.sleep(0.01)


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


Entry = tuple[str, int, str]
"""A mailbox entry as these checks compare it: (conversation, seq, message id)."""


async def _lane(client: CommitClient, tenant: str, user: str, cursor: MailboxCursor) -> list[Entry]:
    found: list[Entry] = []
    for _ in range(1000):
        page = await client.sync(tenant, user, cursor, limit=50)
        found += [(e.record.conversation, e.record.seq, e.record.message_id) for e in page.entries]
        cursor = page.next_cursor
        if not page.more:
            return found
    raise AssertionError("the lane did not end")


def _lane_problem(user: str, lane: list[Entry], expected: list[Entry]) -> str:
    """What is wrong with ``user``'s lane: what is missing, held twice or unexpected,
    else the order (a bare list diff does not tell a loss from a reordering)."""
    counts = Counter(lane)
    missing = [e for e in expected if e not in counts]
    twice = [e for e, n in counts.items() if n > 1]
    strange = [e for e in counts if e not in set(expected)]
    if missing or twice or strange:
        return f"{user}: missing {missing}, held twice {twice}, not expected {strange}"
    return f"{user}: every message once, out of order: {[seq for _, seq, _ in lane]}"


async def _holds_last(
    client: CommitClient, tenant: str, user: str, expected: dict[str, list[tuple[str, int, str]]]
) -> bool:
    """Whether ``user``'s inbox (from its trim watermark, if it was trimmed) already
    holds the chatty conversation's last message. The relays go on appending and
    trimming while it is read, so a cursor can expire between two pages: the read
    starts again from the new watermark, as a client does."""
    cursor = MailboxCursor()
    for _ in range(100):
        try:
            entries = await _lane(client, tenant, user, cursor)
        except CursorExpired as expired:
            cursor = MailboxCursor("inbox", expired.epoch, expired.trim_watermark)
            continue
        return expected["chatty"][-1] in entries
    raise AssertionError(f"{user}'s inbox kept expiring under the reader")


async def _ghost_claims(
    backend: Backend, tenant: str, conversation: str
) -> tuple[Lease, list[PartitionEntry]]:
    """Claim the partition holding ``conversation``'s entries, as a relay that then stalls."""
    assert backend.delivery is not None
    parts = backend.delivery.partitions
    for partition in parts.partitions():
        lease = await parts.acquire(partition, "ghost", 3000)
        if lease is None:
            continue
        claimed = await parts.claim(lease, 1000)
        if any(h.entry.tenant == tenant and h.entry.conversation == conversation for h in claimed):
            return lease, claimed
        await parts.release(lease)  # what it claimed there stays unsettled: the relays reconcile it
    raise AssertionError("no partition holds the conversation's entries")


async def test_every_message_reaches_every_frozen_recipient_once_through_kills(
    stack: Stack,
) -> None:
    tenant = unique("t")
    serve_args = [*stack.args, "--recovery-interval", "1s", "--fanout-threshold", str(THRESHOLD)]
    servers = [ServeProcess(serve_args, stack.env) for _ in range(2)]
    relays: list[RelayProcess] = []
    direct = await open_backend(stack.config)
    channels = [aio.insecure_channel(s.target, options=list(CHANNEL_OPTIONS)) for s in servers]
    clients = [CommitClient(c, ATTEMPT) for c in channels]
    try:
        members = {f"c{n}": [f"u{n}a", f"u{n}b", f"u{n}c"] for n in range(REGULAR)}
        members["big"] = [f"b{n}" for n in range(THRESHOLD + 1)]
        members["chatty"] = ["x1", "x2"]
        for conversation, users in members.items():
            await clients[0].create_conversation(tenant, conversation, users)
        acks = Acks()
        for n in range(3):  # before any relay: the ghost will hold these
            await _commit(clients, send(tenant, "c0", sender="u0a", cmid=f"pre-{n}"), acks)
        ghost, ghost_held = await _ghost_claims(direct, tenant, "c0")

        relays = [RelayProcess(stack.args, _relay_env(stack)) for _ in range(2)]
        counts = {c: PER_CONVERSATION for c in members} | {"chatty": CHATTY}
        workers = [
            asyncio.create_task(_worker(clients, tenant, c, users, counts[c], acks))
            for c, users in members.items()
        ]
        total = sum(counts.values()) + 3
        await _until(lambda: acks.count > total // 4, DEADLINE_S, "a quarter of the load")
        relays[0].kill()  # kill -9 of a relay mid-delivery
        relays.append(RelayProcess(stack.args, _relay_env(stack)))
        await _until(lambda: acks.count > total // 2, DEADLINE_S, "half of the load")
        servers[0].kill()  # kill -9 of a server mid-commit: the workers fail over
        await _until(lambda: acks.count > 3 * total // 4, DEADLINE_S, "three quarters")
        relays[1].signal(signal.SIGSTOP)  # frozen past its lease: deposed
        await asyncio.sleep(1.75 * LEASE_S[stack.name])
        relays[1].signal(signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*workers), DEADLINE_S)
        assert acks.count == total

        # Every ACKed message, each recipient, exactly once, in seq order.
        reader = clients[1]
        expected = {c: [(c, s, m) for s, m in sorted(v)] for c, v in acks.by_conversation.items()}

        async def delivered() -> bool:
            for conversation, users in members.items():
                if conversation in ("big", "chatty"):
                    continue
                for user in users:
                    if len(await _lane(reader, tenant, user, MailboxCursor())) < len(
                        expected[conversation]
                    ):
                        return False
            big = await _lane(reader, tenant, "b0", MailboxCursor("conversation:big"))
            if len(big) < len(expected["big"]):
                return False
            # The chatty inboxes are checked below only once their last message is in.
            return all([await _holds_last(reader, tenant, u, expected) for u in members["chatty"]])

        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while not await delivered():
            assert loop.time() < deadline, "the relays did not deliver everything in time"
            await asyncio.sleep(0.2)
        for conversation, users in members.items():
            if conversation in ("big", "chatty"):
                continue
            for user in users:
                lane = await _lane(reader, tenant, user, MailboxCursor())
                assert lane == expected[conversation], _lane_problem(
                    user, lane, expected[conversation]
                )
        for user in members["big"]:
            assert (
                await _lane(reader, tenant, user, MailboxCursor("conversation:big"))
                == expected["big"]
            )
            assert await _lane(reader, tenant, user, MailboxCursor()) == []  # never fanned out

        # The chatty inboxes were trimmed: CURSOR_EXPIRED, then history + the rest.
        for user in members["chatty"]:
            with pytest.raises(CursorExpired) as caught:
                await reader.sync(tenant, user, MailboxCursor())
            watermark = caught.value.trim_watermark
            assert watermark > 0 and caught.value.epoch == 1
            rest = await _lane(reader, tenant, user, MailboxCursor("inbox", 1, watermark))
            assert rest == expected["chatty"][len(expected["chatty"]) - len(rest) :]
            assert len(rest) <= MAX_ENTRIES
            history = await reader.history(
                HistoryQuery(tenant, "chatty", user, Direction.FORWARD, 0, 200)
            )
            assert [("chatty", r.seq, r.message_id) for r in history.records] == expected["chatty"]

        # The ghost was deposed: a newer token holds its partition.
        assert direct.delivery is not None
        with pytest.raises(LeaseLost):
            await direct.delivery.partitions.settle(
                ghost, Settlement(sent=tuple(h.position for h in ghost_held))
            )
        records = await direct.delivery.records.records(tenant, "c0", [1])
        (outcome,) = await direct.delivery.mailbox.append(
            [AppendRequest(Mailbox.inbox(tenant, "u0b"), (MailboxItem(records[1]),))],
            ghost.fence,
        )
        assert outcome.fenced

        live = [r for r in relays if r.process.poll() is None]
        assert len(live) == 2
        for relay in relays:  # log hygiene: no address, no message body
            log = relay.log()
            assert "hello" not in log and "relaying as" in log
            for secret in stack.secrets:
                assert secret not in log
        takeovers = sum(_metric(r.http, "message_committer_relay_takeovers_total") for r in live)
        assert takeovers > 0
        fanout = sum(_metric(r.http, "message_committer_relay_fanout_entries_total") for r in live)
        fenced = sum(_metric(r.http, "message_committer_relay_fenced_total") for r in live)
        print(
            f"\nDELIVERY E2E {stack.name}: {acks.count} messages, {fanout:.0f} mailbox entries"
            f" by the live relays, takeovers {takeovers:.0f}, fenced {fenced:.0f}"
        )
        assert live[0].terminate() == 0  # SIGTERM: the step finishes, every lease is released
        assert "stopped: leases released" in live[0].log()
    except BaseException:
        logs = [s.log() for s in servers] + [r.log() for r in relays]
        for n, log in enumerate(logs):
            print(f"--- process {n} log ---\n{log[-4000:]}")
        raise
    finally:
        for relay in relays:
            with contextlib.suppress(Exception):
                relay.signal(signal.SIGCONT)
        for client in clients:
            await client.close()
        for relay in relays:
            relay.close()
        for server in servers:
            server.close()
        await direct.close()
