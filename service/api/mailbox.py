"""The MailboxService servicer: Sync pages and Subscribe hints (DESIGN §10).

One reading rule for every lane (DESIGN §10): the gateway authenticated
``user``; the inbox is the user's own (the relay wrote there only what was
frozen for it); a conversation lane shows the user the entries committed
while it was a member (``service.domain.mailbox.readable`` over its
membership intervals, one point lookup), so a user who was ever a member may
sync it, one who never was is refused (NotAMember). CursorExpired goes to the
interceptor as FAILED_PRECONDITION / CURSOR_EXPIRED with the lane, epoch and
trim watermark in its ErrorInfo.

Subscribe reads its lanes' heads once, then is woken by the process's one
``LaneWatch`` (which reads every watched lane every ``poll_interval``, in
calls of 1,000 lanes, whatever the number of streams) when one changed; it
sends a hint per changed lane, a heartbeat every ``heartbeat_seconds``, and
looks for the user's big-conversation lanes again every minute; it ends when
the client goes away or the server starts shutting down (``stopping``).
Hints never carry entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from grpc import aio

from service.api import convert
from service.api.lane_watch import LaneWatch
from service.domain import mailbox as lanes
from service.domain.delivery import DeliveryPorts
from service.domain.errors import (
    ConversationNotFound,
    InvalidRequest,
    NotAMember,
    StoreError,
    StoreUnavailable,
    Unavailable,
)
from service.domain.ids import check_id
from service.domain.mailbox import (
    LaneState,
    Mailbox,
    MailboxCursor,
    MailboxEntry,
    MailboxPage,
    Reader,
)
from service.domain.ports import Clock, MembershipStore
from service.gen.message_committer.v1 import mailbox_pb2 as pb
from service.gen.message_committer.v1 import mailbox_pb2_grpc
from service.tasks import wait_event

Context = aio.ServicerContext[Any, Any]

DEFAULT_HEARTBEAT_S = 15
MAX_HEARTBEAT_S = 60
LANE_REFRESH_S = 60.0
"""How often a Subscribe stream looks again for the user's big-conversation lanes."""
MAX_SUBSCRIBED_CONVERSATIONS = 10_000
INDEX_PAGE = 1000


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Store errors as the CommitError family (no backend text)."""
    try:
        yield
    except StoreUnavailable as exc:
        raise Unavailable("mailboxes are unavailable: backend error") from exc
    except StoreError as exc:
        raise Unavailable(f"mailboxes are unavailable ({type(exc).__name__})") from exc


def cursor_from_proto(request: pb.SyncRequest) -> MailboxCursor:
    if not request.HasField("cursor"):
        return MailboxCursor()
    c = request.cursor
    return MailboxCursor(c.lane or lanes.INBOX, c.epoch, c.seq).validate()


def page_to_proto(page: MailboxPage) -> pb.SyncResponse:
    events = [
        pb.MailboxEvent(
            seq=e.seq,
            group_id=e.group_id,
            message_added=pb.MessageAdded(message=convert.record_to_proto(e.record)),
            delivered_ts_ms=e.appended_ms,
        )
        for e in page.entries
    ]
    if page.withheld:  # in seq order among the others: the page stays gap-free
        events += [
            pb.MailboxEvent(seq=seq, group_id=group, withheld=pb.Withheld())
            for seq, group in page.withheld
        ]
        events.sort(key=lambda e: e.seq)
    c = page.next_cursor
    return pb.SyncResponse(
        events=events,
        next_cursor=pb.MailboxCursor(lane=c.lane, epoch=c.epoch, seq=c.seq),
        more=page.more,
        trim_watermark=page.trim_watermark,
        head=page.head,
    )


def page_from_proto(msg: pb.SyncResponse) -> MailboxPage:
    """A SyncResponse as the client sees it (the inverse of ``page_to_proto``)."""
    c = msg.next_cursor
    entries = tuple(
        MailboxEntry(
            e.seq, e.group_id, convert.record_from_proto(e.message_added.message), e.delivered_ts_ms
        )
        for e in msg.events
        if e.WhichOneof("event") == "message_added"
    )
    withheld = tuple((e.seq, e.group_id) for e in msg.events if e.HasField("withheld"))
    return MailboxPage(
        lane=c.lane,
        entries=entries,
        next_cursor=MailboxCursor(c.lane, c.epoch, c.seq),
        more=msg.more,
        trim_watermark=msg.trim_watermark,
        head=msg.head,
        withheld=withheld,
    )


def sync_request(
    tenant: str, user: str, cursor: MailboxCursor, limit: int = 0, max_bytes: int = 0
) -> pb.SyncRequest:
    return pb.SyncRequest(
        tenant=tenant,
        user=user,
        cursor=pb.MailboxCursor(lane=cursor.lane, epoch=cursor.epoch, seq=cursor.seq),
        limit=limit,
        max_bytes=max_bytes,
    )


class MailboxServicer(mailbox_pb2_grpc.MailboxServiceServicer):
    """Serves message_committer.v1.MailboxService over a backend's delivery ports."""

    def __init__(
        self,
        delivery: DeliveryPorts,
        membership: MembershipStore,
        clock: Clock,
        *,
        poll_interval_s: float,
        stopping: asyncio.Event,
    ) -> None:
        self._delivery = delivery
        self._membership = membership
        self._clock = clock
        self._stopping = stopping
        self._watch = LaneWatch(delivery.mailbox, poll_interval_s, stopping)

    async def _authorise(self, tenant: str, user: str, lane: str) -> tuple[Mailbox, Reader]:
        """The lane's mailbox and who ``user`` is to it (``lanes.readable``)."""
        conversation = lanes.parse_lane(lane)
        if conversation is None:
            return Mailbox.inbox(tenant, user), None
        with store_errors():
            intervals = await self._membership.member_intervals(tenant, conversation, user)
        if intervals is None:
            raise ConversationNotFound("conversation not found")
        if not intervals:
            raise NotAMember("the user was never a member of the conversation of this lane")
        return Mailbox.conversation(tenant, conversation), intervals

    async def Sync(self, request: pb.SyncRequest, context: Context) -> pb.SyncResponse:
        tenant, user = check_id("tenant", request.tenant), check_id("user", request.user)
        cursor = cursor_from_proto(request)
        limit, max_bytes = lanes.sync_limits(request.limit, request.max_bytes)
        mailbox, reader = await self._authorise(tenant, user, cursor.lane)
        with store_errors():
            page = await self._delivery.mailbox.sync(mailbox, cursor, limit, max_bytes, reader)
        return page_to_proto(page)

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: Context
    ) -> AsyncIterator[pb.SubscribeResponse]:
        tenant, user = check_id("tenant", request.tenant), check_id("user", request.user)
        if request.heartbeat_seconds > MAX_HEARTBEAT_S:
            raise InvalidRequest(f"heartbeat_seconds must be 1 to {MAX_HEARTBEAT_S} (0: 15)")
        heartbeat_s = request.heartbeat_seconds or DEFAULT_HEARTBEAT_S
        sent: dict[Mailbox, LaneState] = {}
        mailboxes: list[Mailbox] = []
        wake = asyncio.Event()
        refreshed = beat = float("-inf")
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                wake.clear()  # before reading: a change from now on wakes this stream again
                if now - refreshed >= LANE_REFRESH_S:
                    found = [Mailbox.inbox(tenant, user), *await self._big_lanes(tenant, user)]
                    with store_errors():
                        read = await self._delivery.mailbox.lane_state(found)
                    self._watch.unwatch(mailboxes, wake)
                    mailboxes = found
                    self._watch.watch(mailboxes, read, wake)
                    refreshed = now
                    states: list[LaneState | None] = list(read)
                else:
                    states = [self._watch.state(m) for m in mailboxes]
                for mailbox, state in zip(mailboxes, states, strict=True):
                    if state is not None and sent.get(mailbox) != state:
                        sent[mailbox] = state
                        hint = pb.MailboxHint(lane=mailbox.lane, epoch=state.epoch, seq=state.head)
                        yield pb.SubscribeResponse(hint=hint)
                if now - beat >= heartbeat_s:
                    beat = now
                    yield pb.SubscribeResponse(
                        heartbeat=pb.Heartbeat(server_time_ms=self._clock.now_ms())
                    )
                elapsed = time.monotonic()
                wait_s = min(LANE_REFRESH_S - (elapsed - refreshed), heartbeat_s - (elapsed - beat))
                await wait_event(wake, max(0.0, wait_s))
        finally:
            self._watch.unwatch(mailboxes, wake)

    async def _big_lanes(self, tenant: str, user: str) -> list[Mailbox]:
        """The lanes of the big conversations ``user`` is a member of now. A removed
        member may still sync the entries of its time in the lane, but nothing new
        there is for it, so its lane is not watched."""
        candidates: list[Mailbox] = []
        after = ""
        with store_errors():
            while len(candidates) < MAX_SUBSCRIBED_CONVERSATIONS:
                ids, after = await self._delivery.index.conversations(
                    tenant, user, after, INDEX_PAGE
                )
                candidates += [Mailbox.conversation(tenant, c) for c in ids]
                if not after:
                    break
            if not candidates:
                return []
            states = await self._delivery.mailbox.lane_state(candidates)
            big = [m for m, s in zip(candidates, states, strict=True) if s.head or s.epoch > 1]
            admitted = []
            for mailbox in big:
                admission = await self._membership.admission(tenant, mailbox.owner, user)
                if admission is not None and admission.member:
                    admitted.append(mailbox)
        return admitted
