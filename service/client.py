"""A typed asyncio client of the message commit service.

It speaks domain types (``AuthenticatedSend`` in, ``CommittedMessage`` out)
and raises the same exception classes the server raised (``CommitError``
and its subclasses, from ``service.api.errors.from_status``).

Retries: a call that fails with UNAVAILABLE (a Recoverable commit, a backend
that did not answer, a server that could not be reached) or whose attempt
timed out is sent again, the very same request, so a commit is retried with
the same key and converges on one message. Attempts are bounded in count
(``RetryPolicy.max_attempts``) and in time (``RetryPolicy.deadline_s`` for
the whole call), with jittered exponential backoff, never shorter than the
server's RetryInfo hint. CreateConversation is not retried (a lost reply
would turn into ALREADY_EXISTS).

Example::

    async with CommitClient.connect("127.0.0.1:50051") as client:
        ack = await client.commit(send)
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

from service.api import convert, errors
from service.api.mailbox import page_from_proto, sync_request
from service.domain.ids import CommitKey
from service.domain.mailbox import MailboxCursor, MailboxPage
from service.domain.model import (
    Abandonment,
    AbandonOutcome,
    AuthenticatedSend,
    CommittedMessage,
    HistoryPage,
    HistoryQuery,
    MemberPage,
    RecoveryReport,
)
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import (
    committer_pb2_grpc,
    mailbox_pb2,
    mailbox_pb2_grpc,
    membership_pb2_grpc,
    recovery_pb2,
    recovery_pb2_grpc,
)
from service.gen.message_committer.v1 import membership_pb2 as mpb

DEFAULT_TARGET = "127.0.0.1:50051"
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard one call tries."""

    max_attempts: int = 5
    """Attempts per call, the first included."""

    initial_backoff_s: float = 0.05
    """Pause before the second attempt; doubles per attempt (jittered)."""

    max_backoff_s: float = 1.0
    """Longest pause between two attempts."""

    attempt_timeout_s: float = 5.0
    """Deadline of one attempt."""

    deadline_s: float = 15.0
    """Deadline of the whole call, all attempts and pauses included."""


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """PEM bytes for a TLS channel; ``cert`` and ``key`` for mutual TLS."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """A conversation's membership version after an admin call."""

    tenant: str
    conversation: str
    version: int
    member_count: int


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    """One entry of ListConversations: a conversation and the lane its messages use."""

    conversation: str
    version: int
    member_count: int
    lane: str


@dataclass(frozen=True, slots=True)
class LeftSummary:
    """One entry of ListLeftConversations: a conversation the user left, when, and its lane."""

    conversation: str
    lane: str
    left_at_version: int
    left_at_ms: int


@dataclass(frozen=True, slots=True)
class ExistingSend:
    """ResumeExisting's answer: the commit of the send if its key is known, and
    how long the server keeps keys (0 when it does not say)."""

    message: CommittedMessage | None
    idempotency_window_ms: int


class CommitClient:
    """Calls the v1 services (and health) over one channel."""

    def __init__(self, channel: aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._channel = channel
        self._retry = retry or RetryPolicy()
        self._commits = committer_pb2_grpc.MessageCommitterServiceStub(channel)
        self._members = membership_pb2_grpc.ConversationMembershipServiceStub(channel)
        self._recovery = recovery_pb2_grpc.RecoveryAdminServiceStub(channel)
        self._mailbox = mailbox_pb2_grpc.MailboxServiceStub(channel)
        self._health_check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        self._rng = random.Random()
        self.retries = 0
        """Attempts beyond the first, over the client's life (for tests and logs)."""

    @classmethod
    def connect(
        cls,
        target: str = DEFAULT_TARGET,
        *,
        tls: ClientTls | None = None,
        retry: RetryPolicy | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> CommitClient:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if tls is None:
            channel = aio.insecure_channel(target, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
            )
            channel = aio.secure_channel(target, credentials, options=options)
        return cls(channel, retry)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- the call loop -------------------------------------------------------

    async def _call(
        self, method: aio.UnaryUnaryMultiCallable[Req, Resp], request: Req, *, retry: bool = True
    ) -> Resp:
        policy = self._retry if retry else NO_RETRY
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.deadline_s
        backoff = policy.initial_backoff_s
        for attempt in range(1, policy.max_attempts + 1):
            timeout = max(0.001, min(policy.attempt_timeout_s, deadline - loop.time()))
            try:
                return await method(request, timeout=timeout)
            except aio.AioRpcError as err:
                details = errors.parse_details(_trailers(err))
                error = errors.from_status(err.code(), err.details() or "", details)
                pause = max(self._rng.uniform(backoff / 2, backoff), details.retry_after_s or 0.0)
                last = attempt == policy.max_attempts or loop.time() + pause >= deadline
                if err.code() not in RETRYABLE or last:
                    raise error from None
            self.retries += 1
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, policy.max_backoff_s)
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    # --- MessageCommitterService ---------------------------------------------

    async def commit(self, send: AuthenticatedSend) -> CommittedMessage:
        """Commit ``send``; retried with the same key until committed or out of attempts."""
        request = pb.CommitRequest(send=convert.send_to_proto(send))
        response = await self._call(self._commits.Commit, request)
        return convert.committed_from_proto(response.message)

    async def resume(self, key: CommitKey, conversation: str) -> CommittedMessage:
        request = pb.ResumeRequest(
            tenant=key.tenant,
            sender=key.sender,
            client_message_id=key.cmid,
            conversation=conversation,
        )
        response = await self._call(self._commits.Resume, request)
        return convert.committed_from_proto(response.message)

    async def resume_existing(self, send: AuthenticatedSend) -> CommittedMessage | None:
        """The commit of exactly ``send`` if its key is known, else None."""
        return (await self.find_existing(send)).message

    async def find_existing(self, send: AuthenticatedSend) -> ExistingSend:
        """``resume_existing`` with the server's idempotency window: a None past
        that window does not prove the send was never committed."""
        request = pb.ResumeExistingRequest(send=convert.send_to_proto(send))
        response = await self._call(self._commits.ResumeExisting, request)
        found = convert.committed_from_proto(response.message) if response.found else None
        return ExistingSend(found, response.idempotency_window_ms)

    async def recover_due(self, older_than_ms: int = 0, max_items: int = 0) -> RecoveryReport:
        """Work the recovery queue: intents due before ``older_than_ms`` (0: the server's now)."""
        request = pb.RecoverDueRequest(older_than_ms=older_than_ms, max_items=max_items)
        r = await self._call(self._commits.RecoverDue, request)
        return RecoveryReport(r.scanned, r.recovered, r.failed, r.quarantined)

    async def history(self, query: HistoryQuery) -> HistoryPage:
        request = convert.history_query_to_proto(query)
        response = await self._call(self._commits.History, request)
        return convert.page_from_proto(response.page)

    # --- ConversationMembershipService -----------------------------------------

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipChange:
        request = mpb.CreateConversationRequest(
            tenant=tenant, conversation=conversation, members=list(members)
        )
        response = await self._call(self._members.CreateConversation, request, retry=False)
        return _change(response.membership)

    async def add_members(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipChange:
        request = mpb.AddMembersRequest(
            tenant=tenant, conversation=conversation, members=list(members)
        )
        return _change((await self._call(self._members.AddMembers, request)).membership)

    async def remove_members(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipChange:
        request = mpb.RemoveMembersRequest(
            tenant=tenant, conversation=conversation, members=list(members)
        )
        return _change((await self._call(self._members.RemoveMembers, request)).membership)

    async def list_members(
        self, tenant: str, conversation: str, *, page_size: int = 0, page_token: str = ""
    ) -> MemberPage:
        request = mpb.ListMembersRequest(
            tenant=tenant, conversation=conversation, page_size=page_size, page_token=page_token
        )
        response = await self._call(self._members.ListMembers, request)
        return MemberPage(tuple(response.members), response.version, response.next_page_token)

    async def list_conversations(
        self, tenant: str, user: str, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[ConversationSummary], str]:
        """One page of the user's conversations and the next page's token ("" at the end)."""
        request = mpb.ListConversationsRequest(
            tenant=tenant, user=user, page_size=page_size, page_token=page_token
        )
        response = await self._call(self._members.ListConversations, request)
        found = [
            ConversationSummary(c.conversation, c.version, c.member_count, c.lane)
            for c in response.conversations
        ]
        return found, response.next_page_token

    async def list_left_conversations(
        self,
        tenant: str,
        user: str,
        *,
        left_after_ms: int = 0,
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[LeftSummary], str]:
        """One page of the conversations the user left (oldest departure first)
        and the next page's token ("" at the end)."""
        request = mpb.ListLeftConversationsRequest(
            tenant=tenant,
            user=user,
            left_after_ms=left_after_ms,
            page_size=page_size,
            page_token=page_token,
        )
        response = await self._call(self._members.ListLeftConversations, request)
        found = [
            LeftSummary(c.conversation, c.lane, c.left_at_version, c.left_at_ms)
            for c in response.conversations
        ]
        return found, response.next_page_token

    # --- MailboxService ----------------------------------------------------------------

    async def sync(
        self, tenant: str, user: str, cursor: MailboxCursor, *, limit: int = 0, max_bytes: int = 0
    ) -> MailboxPage:
        """The next page after ``cursor`` (CursorExpired when it cannot continue)."""
        request = sync_request(tenant, user, cursor, limit, max_bytes)
        return page_from_proto(await self._call(self._mailbox.Sync, request))

    def subscribe(
        self, tenant: str, user: str, heartbeat_seconds: int = 0
    ) -> aio.UnaryStreamCall[mailbox_pb2.SubscribeRequest, mailbox_pb2.SubscribeResponse]:
        """The hint stream of the user's lanes (iterate it; ``cancel()`` to end it)."""
        request = mailbox_pb2.SubscribeRequest(
            tenant=tenant, user=user, heartbeat_seconds=heartbeat_seconds
        )
        return self._mailbox.Subscribe(request)

    # --- RecoveryAdminService --------------------------------------------------------

    async def list_quarantined(
        self, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[QueuedIntent], str]:
        """One page of quarantined intents and the next page's token ("" at the end)."""
        request = recovery_pb2.ListQuarantinedRequest(page_size=page_size, page_token=page_token)
        response = await self._call(self._recovery.ListQuarantined, request)
        return [_queued(i) for i in response.items], response.next_page_token

    async def recovery_item(self, key: CommitKey) -> QueuedIntent:
        """The recovery-queue entry of ``key`` (NOT_FOUND: no unfinished intent)."""
        request = recovery_pb2.GetRecoveryItemRequest(
            tenant=key.tenant, sender=key.sender, client_message_id=key.cmid
        )
        return _queued((await self._call(self._recovery.GetRecoveryItem, request)).item)

    async def retry_quarantined(self, key: CommitKey) -> CommittedMessage:
        """Take ``key`` out of quarantine and finish it now (not retried by the client)."""
        request = recovery_pb2.RetryQuarantinedRequest(
            tenant=key.tenant, sender=key.sender, client_message_id=key.cmid
        )
        response = await self._call(self._recovery.RetryQuarantined, request, retry=False)
        return convert.committed_from_proto(response.message)

    async def abandon_quarantined(
        self, key: CommitKey, *, operator: str, reason: str
    ) -> Abandonment:
        """Give up on ``key``'s quarantined intent for good (audited; not retried
        by the client; twice answers the first audit record)."""
        request = recovery_pb2.AbandonQuarantinedRequest(
            tenant=key.tenant, sender=key.sender, client_message_id=key.cmid,
            operator=operator, reason=reason,
        )  # fmt: skip
        r = await self._call(self._recovery.AbandonQuarantined, request, retry=False)
        outcome = AbandonOutcome.ABANDONED if r.abandoned_now else AbandonOutcome.ALREADY_ABANDONED
        return Abandonment(outcome, r.conversation, r.seq, r.abandoned_at_ms, r.operator, r.reason)

    # --- health -------------------------------------------------------------------

    async def health(self, service: str = "") -> str:
        """The health status name of ``service`` ("" = the whole server), not retried."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self._call(self._health_check, request, retry=False)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


@dataclass(frozen=True, slots=True)
class QueuedIntent:
    """An entry of the recovery queue as an operator sees it (never content)."""

    key: CommitKey
    conversation: str
    created_at_ms: int
    attempts: int
    quarantined: bool
    problem: str
    decodable: bool
    state: str
    seq: int
    message_id: str


def _queued(msg: recovery_pb2.RecoveryItem) -> QueuedIntent:
    state = recovery_pb2.IntentState.Name(msg.state).removeprefix("INTENT_STATE_").lower()
    return QueuedIntent(
        key=CommitKey(msg.tenant, msg.sender, msg.client_message_id),
        conversation=msg.conversation,
        created_at_ms=msg.created_at_ms,
        attempts=msg.attempts,
        quarantined=msg.quarantined,
        problem=msg.problem,
        decodable=msg.decodable,
        state=state if msg.decodable else "undecodable",
        seq=msg.seq,
        message_id=msg.message_id,
    )


def _change(msg: mpb.MembershipVersion) -> MembershipChange:
    return MembershipChange(msg.tenant, msg.conversation, msg.version, msg.member_count)


def _trailers(err: aio.AioRpcError) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in err.trailing_metadata() or ()]
