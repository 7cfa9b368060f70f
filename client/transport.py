"""The runtime's view of the server (``ServerApi``) and its gRPC implementation.

One ``ServerApi`` is one connection: the runtime opens a new one (through a
``Connector``) for every connection attempt and closes it when it leaves
ONLINE, so a dead channel is never reused. Calls are made once, with a
deadline, never retried here: the runtime decides what a failure means
(reconnect and reconcile, park, wait).

Errors are the service's own classes (``service.api.errors.from_status``):
CommitError subclasses, ``Unavailable`` for a server that cannot be reached,
``RemoteError`` for statuses outside the table (DEADLINE_EXCEEDED for an ACK
or a sync past its deadline).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from grpc import aio

from client.model import (
    ConversationPage,
    ConversationSummary,
    Heartbeat,
    LeftConversation,
    LeftConversationPage,
    MailboxCursor,
    MailboxEvent,
    MailboxHint,
    MailboxPage,
)
from service.api import convert, errors
from service.client import ClientTls, CommitClient, ExistingSend, RetryPolicy
from service.domain.errors import Unavailable
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    HistoryPage,
    HistoryQuery,
    MemberPage,
)
from service.gen.message_committer.v1 import mailbox_pb2 as xpb
from service.gen.message_committer.v1 import mailbox_pb2_grpc, membership_pb2_grpc
from service.gen.message_committer.v1 import membership_pb2 as mpb

Req = TypeVar("Req")
Resp = TypeVar("Resp")
StreamItem = MailboxHint | Heartbeat
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class ServerApi(abc.ABC):
    """One connection to the service, as the runtime uses it."""

    @abc.abstractmethod
    async def wait_ready(self) -> None:
        """Return once the connection is up; raise Unavailable when it does not come up."""

    @abc.abstractmethod
    async def commit(self, send: AuthenticatedSend) -> CommittedMessage:
        """Commit (or replay the ACK of) ``send``; the ACK deadline applies."""

    @abc.abstractmethod
    async def find_existing(self, send: AuthenticatedSend) -> ExistingSend:
        """The commit of exactly ``send`` if the server still knows its key, with
        the server's idempotency window (past it, "not found" proves nothing)."""

    @abc.abstractmethod
    async def history(self, query: HistoryQuery) -> HistoryPage: ...

    @abc.abstractmethod
    async def list_members(
        self, tenant: str, conversation: str, page_size: int, page_token: str
    ) -> MemberPage: ...

    @abc.abstractmethod
    async def list_conversations(
        self, tenant: str, user: str, page_size: int, page_token: str
    ) -> ConversationPage: ...

    @abc.abstractmethod
    async def list_left_conversations(
        self, tenant: str, user: str, left_after_ms: int, page_size: int, page_token: str
    ) -> LeftConversationPage: ...

    @abc.abstractmethod
    async def sync(self, tenant: str, user: str, cursor: MailboxCursor, limit: int) -> MailboxPage:
        """The next page after ``cursor``; CursorExpired when it expired."""

    @abc.abstractmethod
    def subscribe(self, tenant: str, user: str, heartbeat_s: int) -> AsyncIterator[StreamItem]:
        """Hints and heartbeats until the stream ends or fails."""

    @abc.abstractmethod
    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CallTimeouts:
    """The deadlines a connection applies, from ``RuntimeConfig`` (its one home)."""

    ack_s: float
    """One Commit (``RuntimeConfig.ack_timeout_s``)."""
    rpc_s: float
    """Every other call, and the connection coming up (``rpc_timeout_s``)."""


class Connector(Protocol):
    """Opens one connection per attempt, with the runtime's deadlines."""

    def open(self, timeouts: CallTimeouts) -> ServerApi: ...


@dataclass(frozen=True, slots=True)
class GrpcConnector:
    """Connections to one server address over gRPC (TLS when ``tls`` is given)."""

    target: str
    tls: ClientTls | None = None

    def open(self, timeouts: CallTimeouts) -> GrpcServerApi:
        return GrpcServerApi(self, timeouts)


def _channel(where: GrpcConnector) -> aio.Channel:
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # One channel per connection attempt: the runtime owns the backoff.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    if where.tls is None:
        return aio.insecure_channel(where.target, options=options)
    t = where.tls
    credentials = grpc.ssl_channel_credentials(
        root_certificates=t.ca, private_key=t.key, certificate_chain=t.cert
    )
    return aio.secure_channel(where.target, credentials, options=options)


def _once(timeout_s: float) -> RetryPolicy:
    return RetryPolicy(max_attempts=1, attempt_timeout_s=timeout_s, deadline_s=timeout_s)


class GrpcServerApi(ServerApi):
    """The service's v1 RPCs over one channel: the project's typed client for the
    commit and membership calls, the generated stubs for mailboxes and
    ListConversations."""

    def __init__(self, where: GrpcConnector, timeouts: CallTimeouts) -> None:
        self._channel = _channel(where)
        self._acks = CommitClient(self._channel, _once(timeouts.ack_s))
        self._reads = CommitClient(self._channel, _once(timeouts.rpc_s))
        self._timeout = timeouts.rpc_s
        self._mailbox = mailbox_pb2_grpc.MailboxServiceStub(self._channel)
        self._members = membership_pb2_grpc.ConversationMembershipServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self) -> None:
        try:
            async with asyncio.timeout(self._timeout):  # not wait_for: see service.tasks
                await self._channel.channel_ready()
        except TimeoutError:
            raise Unavailable("the server could not be reached") from None

    async def commit(self, send: AuthenticatedSend) -> CommittedMessage:
        return await self._acks.commit(send)

    async def find_existing(self, send: AuthenticatedSend) -> ExistingSend:
        return await self._reads.find_existing(send)

    async def history(self, query: HistoryQuery) -> HistoryPage:
        return await self._reads.history(query)

    async def list_members(
        self, tenant: str, conversation: str, page_size: int, page_token: str
    ) -> MemberPage:
        return await self._reads.list_members(
            tenant, conversation, page_size=page_size, page_token=page_token
        )

    async def list_conversations(
        self, tenant: str, user: str, page_size: int, page_token: str
    ) -> ConversationPage:
        request = mpb.ListConversationsRequest(
            tenant=tenant, user=user, page_size=page_size, page_token=page_token
        )
        response = await self._unary(self._members.ListConversations, request)
        return ConversationPage(
            tuple(
                ConversationSummary(c.conversation, c.version, c.member_count, c.lane)
                for c in response.conversations
            ),
            response.next_page_token,
        )

    async def list_left_conversations(
        self, tenant: str, user: str, left_after_ms: int, page_size: int, page_token: str
    ) -> LeftConversationPage:
        request = mpb.ListLeftConversationsRequest(
            tenant=tenant,
            user=user,
            left_after_ms=left_after_ms,
            page_size=page_size,
            page_token=page_token,
        )
        response = await self._unary(self._members.ListLeftConversations, request)
        return LeftConversationPage(
            tuple(
                LeftConversation(c.conversation, c.lane, c.left_at_version, c.left_at_ms)
                for c in response.conversations
            ),
            response.next_page_token,
        )

    async def sync(self, tenant: str, user: str, cursor: MailboxCursor, limit: int) -> MailboxPage:
        request = xpb.SyncRequest(
            tenant=tenant,
            user=user,
            cursor=xpb.MailboxCursor(lane=cursor.lane, epoch=cursor.epoch, seq=cursor.seq),
            limit=limit,
        )
        return page_of(cursor, await self._unary(self._mailbox.Sync, request))

    async def subscribe(
        self, tenant: str, user: str, heartbeat_s: int
    ) -> AsyncIterator[StreamItem]:
        request = xpb.SubscribeRequest(tenant=tenant, user=user, heartbeat_seconds=heartbeat_s)
        call = self._mailbox.Subscribe(request)
        try:
            async for item in call:
                kind = item.WhichOneof("kind")
                if kind == "hint":
                    yield MailboxHint(item.hint.lane, item.hint.epoch, item.hint.seq)
                elif kind == "heartbeat":
                    yield Heartbeat(item.heartbeat.server_time_ms)
        except aio.AioRpcError as err:
            raise _error(err) from None
        finally:
            call.cancel()

    async def _unary(self, method: aio.UnaryUnaryMultiCallable[Req, Resp], request: Req) -> Resp:
        try:
            return await method(request, timeout=self._timeout)
        except aio.AioRpcError as err:
            raise _error(err) from None


def page_of(cursor: MailboxCursor, r: xpb.SyncResponse) -> MailboxPage:
    """A Sync answer as a page. A withheld entry (one this user may not read) and
    an event of a kind this runtime does not know (a newer server's) keep their
    seq and group, so the page has no gap and the cursor moves past them; they
    add no message (the unknown kind is kept as opaque bytes)."""
    events = tuple(_event(e) for e in r.events)
    c = r.next_cursor
    return MailboxPage(
        lane=cursor.lane,
        events=events,
        next_cursor=MailboxCursor(c.lane, c.epoch, c.seq),
        more=r.more,
        trim_watermark=r.trim_watermark,
        head=r.head,
    )


def _event(e: xpb.MailboxEvent) -> MailboxEvent:
    kind = e.WhichOneof("event")
    if kind == "message_added":
        record = convert.record_from_proto(e.message_added.message)
        return MailboxEvent(e.seq, e.group_id, record, e.delivered_ts_ms)
    if kind == "withheld":
        return MailboxEvent(e.seq, e.group_id, None, e.delivered_ts_ms)
    return MailboxEvent(e.seq, e.group_id, None, e.delivered_ts_ms, e.SerializeToString())


def _error(err: aio.AioRpcError) -> Exception:
    trailers: list[tuple[str, Any]] = [(k, v) for k, v in err.trailing_metadata() or ()]
    details = errors.parse_details(trailers)
    return errors.from_status(err.code(), err.details() or "", details)
