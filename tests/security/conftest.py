"""One real replica per backend for the security suites, with raw stubs and the backend itself.

``served`` is parametrised over memory, redis and scylla (each case carries
that marker, so ``pytest -m redis tests/security`` runs Redis's cases only).
It wires a replica through the real ``service.bootstrap.build_server`` around
a backend of that kind: the memory backend, a ``RedisHarness`` on the
session's redis-server (``redis_url``), or a ``ScyllaHarness`` on the
session's migrated CQL keyspace (``cql_contact``/``cql_keyspace``): the
harness classes behind ``redis_harness``/``scylla_harness``, which are
per-test fixtures and so cannot back a module's replica. The real servers
come from ``tests/servers``; they fail loudly, never skip.

The replica is module-scoped (one per backend per module, on the module's
event loop), so a module using it marks itself
``pytest.mark.asyncio(loop_scope="module")``. The Scylla keyspace is shared by
the whole session, so tests use tenants of their own (``unique_tenant``).

``snapshot`` reads the backend directly (not through the server): a test
takes one before and one after a rejected request and asserts they are equal,
which is how "nothing was written" is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import pytest
import pytest_asyncio
import redis
from google.protobuf.message import Message
from grpc import aio

from backends.memory import MemoryMessageStore, open_memory_backend
from service.api import errors
from service.bootstrap import build_server
from service.domain.faults import FaultPoints
from service.domain.ids import CommitKey
from service.domain.model import Committed, HistoryQuery, LoadedCommit
from service.domain.ports import Backend
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc, membership_pb2_grpc
from service.gen.message_committer.v1 import membership_pb2 as mpb
from service.server import CommitServer
from tests.e2e.conftest import BASE_CONFIG
from tests.servers.cql_server import ScyllaHarness
from tests.servers.redis_server import RedisHarness
from tests.support import members

BACKENDS = [
    pytest.param("memory", marks=pytest.mark.memory),
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("scylla", marks=pytest.mark.scylla),
]
OUTBOX_READ_LIMIT = 10_000
RECOVERY_SCAN_LIMIT = 1_000
RECOVERY_HORIZON_MS = 600_000


def unique_tenant(prefix: str = "sec") -> str:
    """A tenant no other test uses (the CQL keyspace is shared by the session)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Served:
    """One started replica, raw stubs on one channel, and the backend under it."""

    kind: str
    server: CommitServer
    backend: Backend
    faults: FaultPoints
    channel: aio.Channel

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    async def load(
        self, tenant: str, sender: str, cmid: str, conversation: str
    ) -> LoadedCommit | None:
        """What the store holds for a key in a conversation (read directly)."""
        return await self.backend.store.load_commit(CommitKey(tenant, sender, cmid), conversation)

    async def committed(self, tenant: str, sender: str, cmid: str, conversation: str) -> Committed:
        loaded = await self.load(tenant, sender, cmid, conversation)
        assert isinstance(loaded, Committed), f"expected a committed key, found {loaded!r}"
        return loaded


@dataclass(frozen=True)
class ConversationState:
    version: int
    members: frozenset[str]
    last_seq: int | None
    """History's last_seq read as one of the members; None without members."""


@dataclass(frozen=True)
class Snapshot:
    """Everything a request could have written, read straight from the backend."""

    conversations: dict[tuple[str, str], ConversationState | None]
    outbox: tuple[str, ...]
    unfinished: frozenset[CommitKey]
    memory: tuple[int, int, int, int] | None
    """(commits, conversations, recovery entries, outbox publications) of a memory backend."""


async def _conversation_state(
    backend: Backend, tenant: str, conversation: str
) -> ConversationState | None:
    info = await backend.membership.membership_info(tenant, conversation)
    if info is None:
        return None
    everyone = await members(backend, tenant, conversation)
    last_seq = None
    if everyone:
        page = await backend.store.history_page(
            HistoryQuery(tenant, conversation, actor=everyone[0], limit=1)
        )
        last_seq = page.last_seq
    return ConversationState(info.version, frozenset(everyone), last_seq)


async def snapshot(backend: Backend, conversations: Iterable[tuple[str, str]]) -> Snapshot:
    """Read memberships, history boundaries, the outbox and the recovery index (all at once)."""
    watched = list(dict.fromkeys(conversations))
    now_ms = int(time.time() * 1000)
    states, outbox, unfinished = await asyncio.gather(
        asyncio.gather(*(_conversation_state(backend, t, c) for t, c in watched)),
        backend.outbox.read("", OUTBOX_READ_LIMIT),
        backend.store.scan_recoverable_commits(now_ms + RECOVERY_HORIZON_MS, RECOVERY_SCAN_LIMIT),
    )
    memory = None
    positions = tuple(e.publication.position for e in outbox.entries)
    if isinstance(backend.store, MemoryMessageStore):
        state = backend.store.state
        memory = (
            len(state.commits),
            len(state.conversations),
            len(state.queue),
            state.outbox.published,
        )
        positions = ()  # the relay inside drops what it delivered: the count above says it
    return Snapshot(
        dict(zip(watched, states, strict=True)),
        positions,
        frozenset(i.key for i in unfinished),
        memory,
    )


async def _open(kind: str, request: pytest.FixtureRequest) -> tuple[Backend, RedisHarness | None]:
    if kind == "memory":
        return open_memory_backend(), None
    if kind == "redis":
        harness = RedisHarness(request.getfixturevalue("redis_url"))
        return await harness.open(), harness
    host, port = request.getfixturevalue("cql_contact")
    scylla = ScyllaHarness(host, port, request.getfixturevalue("cql_keyspace"))
    return await scylla.open(), None


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """A replica around a fresh backend of each kind, for the whole module."""
    kind: str = request.param
    backend, redis_harness = await _open(kind, request)
    config = replace(BASE_CONFIG, backend=kind, readiness_interval=1.0)
    faults = FaultPoints()
    server = build_server(config, backend, faults=faults)
    try:
        await server.start()
    except BaseException:
        await backend.close()
        raise
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            yield Served(kind, server, backend, faults, channel)
    finally:
        await server.stop(grace_s=0.5)  # closes the backend too
        if redis_harness is not None:
            with contextlib.suppress(redis.RedisError):
                redis_harness.delete_keys()


# --- calling the raw API -----------------------------------------------------------

COMMITTER = "message_committer.v1.MessageCommitterService"
MEMBERSHIP = "message_committer.v1.ConversationMembershipService"
CALL_TIMEOUT_S = 15.0

RPCS: dict[str, tuple[str, type[Message]]] = {
    "Commit": (COMMITTER, pb.CommitResponse),
    "Resume": (COMMITTER, pb.ResumeResponse),
    "ResumeExisting": (COMMITTER, pb.ResumeExistingResponse),
    "RecoverDue": (COMMITTER, pb.RecoverDueResponse),
    "History": (COMMITTER, pb.HistoryResponse),
    "CreateConversation": (MEMBERSHIP, mpb.CreateConversationResponse),
    "AddMembers": (MEMBERSHIP, mpb.AddMembersResponse),
    "RemoveMembers": (MEMBERSHIP, mpb.RemoveMembersResponse),
    "ListMembers": (MEMBERSHIP, mpb.ListMembersResponse),
}

# Every (code, ErrorInfo.reason) the README's error table documents, INTERNAL excluded.
DOCUMENTED: frozenset[tuple[grpc.StatusCode, str]] = frozenset(
    (rule.code, rule.reason) for rule in errors.STATUS_TABLE.values()
)


@dataclass(frozen=True)
class Failure:
    """A call that ended with a status other than OK."""

    code: grpc.StatusCode
    message: str
    details: errors.StatusDetails
    trailers: bytes
    """Every trailing metadata value (the status details included), for leak checks."""

    def text(self) -> bytes:
        """All a caller can see of this failure, as bytes."""
        return self.message.encode() + b"\n" + self.trailers


def _identity(data: bytes) -> bytes:
    return data


def _method(channel: aio.Channel, rpc: str, raw: bool) -> aio.UnaryUnaryMultiCallable[Any, Any]:
    """The generated stub's method, or the same path taking wire bytes as they are."""
    service, response = RPCS[rpc]
    if raw:
        return channel.unary_unary(
            f"/{service}/{rpc}",
            request_serializer=_identity,
            response_deserializer=response.FromString,
        )
    stub: object = (
        committer_pb2_grpc.MessageCommitterServiceStub(channel)
        if service == COMMITTER
        else membership_pb2_grpc.ConversationMembershipServiceStub(channel)
    )
    method: aio.UnaryUnaryMultiCallable[Any, Any] = getattr(stub, rpc)
    return method


async def invoke(channel: aio.Channel, rpc: str, request: Message | bytes) -> Message | Failure:
    """Call ``rpc`` through the raw generated stub, or with wire bytes the stub could not
    build; a failure is returned, not raised."""
    call = _method(channel, rpc, raw=isinstance(request, bytes))
    try:
        answer: Message = await call(request, timeout=CALL_TIMEOUT_S)
    except aio.AioRpcError as err:
        pairs = [(k, v) for k, v in err.trailing_metadata() or ()]
        raw = b"\n".join(v if isinstance(v, bytes) else v.encode() for _, v in pairs)
        return Failure(err.code(), err.details() or "", errors.parse_details(pairs), raw)
    return answer


M = TypeVar("M", bound=Message)


async def ok(channel: aio.Channel, rpc: str, request: Message | bytes, answer: type[M]) -> M:
    """Call ``rpc``, which must succeed with an ``answer``."""
    result = await invoke(channel, rpc, request)
    assert isinstance(result, answer), f"{rpc} failed: {result}"
    return result


async def fails(
    channel: aio.Channel, rpc: str, request: Message | bytes, expected: tuple[grpc.StatusCode, str]
) -> Failure:
    """Call ``rpc``, which must fail with the ``(code, reason)`` expected."""
    result = await invoke(channel, rpc, request)
    assert isinstance(result, Failure), f"{rpc} succeeded: {result}"
    assert (result.code, result.details.reason) == expected, result
    return result
