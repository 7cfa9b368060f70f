"""``ClientRuntime`` (DESIGN §11, seed 001): the one runtime every chat host drives.

The host creates it over a LocalStore and a Connector, calls ``connect`` once
(nothing reaches the network before, and there is no default account), then
sends with ``send_message`` and reads ``next_event``. Behind it one
supervisor task runs the connection cycle (``client.connection``):

1. CONNECTING: open a connection, wait for it to come up;
2. SYNCING: sync every known lane to its head, one local transaction per
   page (messages, dedupe, projection, cursor); a CURSOR_EXPIRED answer
   turns into a REBUILD (``begin_rebuild`` → ``finish_rebuild``);
3. reconcile every pending send that ever went out, by its own cmid:
   already in the store → confirmed in place; ResumeExisting found it →
   confirmed with the server's coordinates; not found → it stays pending and
   is resent with the same id;
4. ONLINE: send pending sends one by one, oldest first; follow the
   Subscribe stream's hints (a hint never moves a cursor: it makes the
   runtime sync). An ACK timeout, a PONG timeout or any connection failure
   leaves ONLINE; the cycle starts again after a jittered backoff.

``send_message`` persists the send before anything goes out, so a send whose
ACK was lost (by a crash of either side) is reconciled after the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Literal, TypeVar

from client import codec, pages
from client.config import RuntimeConfig
from client.errors import (
    AlreadyConnected,
    ConnectRequired,
    InvalidArgument,
    LocalStoreFailure,
    Offline,
    RebuildNotAllowed,
    RuntimeStopped,
)
from client.events import (
    ClientEvent,
    ConnectionChanged,
    EventQueue,
    LocalStoreReset,
    MessagesAdded,
    RebuildFinished,
    RebuildStarted,
    SendConfirmed,
    SendFailed,
    Via,
)
from client.faults import ClientCrash, ClientFaults, ClientPoint
from client.model import (
    Backfill,
    ConnectRequest,
    ConversationSummary,
    ConversationView,
    ExpiredCursor,
    LocalMessage,
    MailboxCursor,
    MailboxPage,
    MemberPageRequest,
    PendingSend,
    RebuildPlan,
    SendMessage,
    new_client_message_id,
)
from client.outcomes import Outcome, classify, pull_failure
from client.state import ConnectionState, check_transition
from client.store import CONFLICT_PROBLEM, Applied, LocalStore
from client.transport import Connector, ServerApi
from service.domain.errors import CommitError, InvalidRequest
from service.domain.limits import CommitLimits, validate_send
from service.domain.model import (
    AuthenticatedSend,
    CommittedMessage,
    Direction,
    HistoryPage,
    HistoryQuery,
    MemberPage,
    MessageRecord,
)
from service.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_LIST_PAGES = 1000


class ClientRuntime:
    """Connection, sync, cursors, pending sends, REBUILD and event dedupe for one account."""

    def __init__(
        self,
        store: LocalStore,
        connector: Connector,
        *,
        config: RuntimeConfig | None = None,
        faults: ClientFaults | None = None,
        rng: random.Random | None = None,
        limits: CommitLimits | None = None,
    ) -> None:
        self.store = store
        self.config = (config or RuntimeConfig()).validate()
        self.faults = faults or ClientFaults()
        self._reset_events: list[tuple[LocalStoreReset, int]] = []
        """Announced reset reports the host has not taken yet (see next_event)."""
        self.connector = connector
        self.rng = rng or random.Random()
        self._limits = limits or CommitLimits()
        self._events = EventQueue(self.config.event_capacity)
        self._state = ConnectionState.DISCONNECTED
        self._account: ConnectRequest | None = None
        self.api: ServerApi | None = None
        """The connection of the current cycle (None while disconnected)."""
        self.wake = asyncio.Event()
        self.sync_wanted: set[str] = set()
        self.expired: dict[str, ExpiredCursor] = {}
        self._apply_lock = asyncio.Lock()
        self._rebuild_lock = asyncio.Lock()
        self._supervisor: asyncio.Task[None] | None = None
        self.crash: ClientCrash | None = None
        self.unexpected: Counter[str] = Counter()
        """Exceptions the connection cycle did not expect (bugs), by class."""
        self._stopped = False
        self._backfilled = 0

    # --- state and events ------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def account(self) -> ConnectRequest:
        """The connected account; ConnectRequired before ``connect``."""
        if self._account is None:
            raise ConnectRequired("call connect() first; the runtime has no default account")
        return self._account

    def _set_state(self, state: ConnectionState, reason: str = "") -> None:
        if state is self._state:
            return
        check_transition(self._state, state)
        self._state = state
        log.info("client runtime: %s%s", state.value, f" ({reason})" if reason else "")
        self._emit(ConnectionChanged(state, reason))

    def _emit(self, event: ClientEvent) -> None:
        self._events.put(event)

    async def next_event(self) -> ClientEvent:
        """The next event, in order; RuntimeStopped once stopped and drained. A
        LocalStoreReset taken here is forgotten by the store; one the host never
        took (the process died, or the event was dropped) comes again next open."""
        event = await self._events.get()
        if isinstance(event, LocalStoreReset):
            for i, (announced, report_id) in enumerate(self._reset_events):
                if announced is event:  # by identity: equal resets are distinct reports
                    del self._reset_events[i]
                    with contextlib.suppress(LocalStoreFailure):  # closed: it comes again
                        await self.store.taken_reset(report_id)
                    break
        return event

    async def _announce_resets(self) -> None:
        """LocalStoreReset for each reset report no host took yet, once per runtime."""
        for report in await self.store.untaken_resets():
            if report.report_id in {rid for _, rid in self._reset_events}:
                continue  # announced, not taken yet
            event = LocalStoreReset(report.reason, report.kept_pending, report.lost_pending)
            if report.report_id:
                self._reset_events.append((event, report.report_id))
            self._emit(event)

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    # --- lifecycle ------------------------------------------------------------------------

    async def connect(self, request: ConnectRequest) -> None:
        """Bind the local store to ``request``'s account and start the connection cycle."""
        self._check_running()
        if self._account is not None:
            raise AlreadyConnected("connect() may be called once per runtime")
        try:
            request.validate()
        except InvalidRequest as exc:
            raise InvalidArgument(str(exc)) from None
        await self.store.bind_account(request)
        self._account = request
        await self._announce_resets()
        for expired in await self.store.rebuilding():  # a REBUILD a crash interrupted
            self.expired[expired.lane] = expired
        from client.connection import Supervisor  # the cycle lives beside the commands

        self._supervisor = asyncio.create_task(Supervisor(self).run(), name="client-runtime")

    async def close(self) -> None:
        """Stop the cycle, close the connection and the store; events end with
        RuntimeStopped. Also the way to release a runtime that crashed."""
        self._stopped = True
        try:
            task = self._supervisor
            if task is not None and task is not asyncio.current_task():
                await cancel_and_wait(task)
            if self.api is not None:
                with contextlib.suppress(Exception):
                    await self.api.close()
                self.api = None
            await self.store.close()
        finally:
            if self._state is not ConnectionState.CLOSED:
                self._set_state(ConnectionState.CLOSED, "crashed" if self.crash else "closed")
            self._events.close()

    async def __aenter__(self) -> ClientRuntime:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- reads of the local store (what a host shows) -------------------------------------

    async def messages(
        self, conversation: str, *, limit: int = 50, before_seq: int = 0
    ) -> list[LocalMessage]:
        """The newest ``limit`` stored messages of a conversation below ``before_seq``
        (0: the newest), in ascending seq order."""
        self._check_running()
        return await self.store.messages(conversation, limit=limit, before_seq=before_seq)

    async def pending(self) -> list[PendingSend]:
        """This device's unconfirmed sends (parked ones too), oldest first."""
        self._check_running()
        return await self.store.pending()

    async def conversations(self) -> list[ConversationView]:
        """The local projection of the conversations, by id."""
        self._check_running()
        return await self.store.conversations()

    @property
    def cycle(self) -> asyncio.Task[None] | None:
        """The connection cycle's task (for diagnostics), None before ``connect``."""
        return self._supervisor

    @property
    def stopped(self) -> bool:
        """Closed or crashed: nothing more runs or is written."""
        return self._stopped

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeStopped("the runtime was closed or crashed; open a new one")

    def _die(self, crash: ClientCrash) -> None:
        """An injected crash: stop everything where it is, write nothing more."""
        if self.crash is None:
            self.crash = crash
            log.warning("client runtime: %s", crash)
        self._stopped = True
        task = self._supervisor
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _fail(self, reason: str) -> None:
        """The connection cycle cannot go on: stop, say why (CLOSED with
        ``reason``), and end the events so ``next_event`` raises RuntimeStopped."""
        self._stopped = True
        if self._state is not ConnectionState.CLOSED:
            self._set_state(ConnectionState.CLOSED, reason)
        self._events.close()

    async def _repair_store(self, damage: LocalStoreFailure) -> None:
        """The store was found damaged in use: reset it as an open would (pending
        sends kept), bind it again, and report ``LocalStoreReset``."""
        await self.store.repair(str(damage))
        self.expired.clear()
        self.sync_wanted.clear()
        await self.store.bind_account(self.account)
        await self._announce_resets()

    def _hit(self, point: ClientPoint) -> None:
        try:
            self.faults.check(point)
        except ClientCrash as crash:
            self._die(crash)
            raise

    async def _guarded(self, work: Awaitable[T]) -> T:
        """``work``, with an injected crash inside it (a store's mid-batch point)
        stopping the runtime."""
        try:
            return await work
        except ClientCrash as crash:
            self._die(crash)
            raise

    def _require(self) -> tuple[ConnectRequest, ServerApi | None]:
        self._check_running()
        return self.account, self.api

    # --- sends --------------------------------------------------------------------------

    async def send_message(self, message: SendMessage) -> PendingSend:
        """Persist ``message`` as pending (atomically, before any network I/O) and
        queue it; the outcome arrives as SendConfirmed or SendFailed.

        Idempotent by ``message.cmid`` (the host's own send id): the same send
        again returns the stored pending send, or one with ``confirmed`` set if
        it already went through; it is never queued twice. A cancelled call may
        or may not have persisted the send (the write runs on the store's
        thread and is not undone): call again with the same cmid to know."""
        account, _ = self._require()
        send = AuthenticatedSend(
            tenant=account.tenant,
            sender=account.user,
            device=account.device,
            conversation=message.conversation,
            cmid=message.cmid or new_client_message_id(account.device),
            content=message.content,
            mentions=tuple(message.mentions),
            reply_to=message.reply_to,
        )
        try:
            validate_send(send, self._limits)
        except InvalidRequest as exc:
            raise InvalidArgument(str(exc)) from None
        pending = await self.store.persist_pending(send, self.now_ms())
        if pending.confirmed:
            return pending
        self._hit(ClientPoint.AFTER_PERSIST)
        self.wake.set()
        return pending

    async def retry_parked(self, cmid: str) -> bool:
        """Make a parked send pending again (e.g. after the user was added back)."""
        self._require()
        again = await self.store.unpark_pending(cmid)
        self.wake.set()
        return again

    async def _confirm(self, pending: PendingSend, message: CommittedMessage, via: Via) -> None:
        """Resolve ``pending`` with the server's answer to this very send (its ACK
        or ResumeExisting: the server compared the identity) and report it once."""
        resolved = await self.store.resolve_pending(message, pending.send.content)
        if resolved is not None:
            self._emit(SendConfirmed(pending.cmid, message, via))

    async def _settle_found(self, pending: PendingSend, found: MessageRecord) -> None:
        """A stored message with the pending send's sender and cmid: it confirms
        the send only when its identity is the send's; another identity (another
        device's message, other content) means the server refuses this send."""
        if not codec.same_identity(found, pending.send):
            await self.store.park_pending(pending.cmid, CONFLICT_PROBLEM)
            self._emit(SendFailed(pending.cmid, pending.conversation, *_conflict()))
            return
        r = found
        committed = CommittedMessage(r.conversation, r.cmid, r.message_id, r.seq, r.server_ts_ms)
        resolved = await self.store.resolve_pending(committed, found.content)
        if resolved is not None:
            self._emit(SendConfirmed(pending.cmid, committed, "mailbox"))

    # --- batches --------------------------------------------------------------------------

    async def apply_mailbox_batch(self, page: MailboxPage) -> Applied:
        """Apply one page of complete groups that continues the stored cursor: its
        messages, dedupe, projection and the new cursor in one local transaction."""
        self._require()
        async with self._apply_lock:
            cursor = await self.store.cursor(page.lane) or MailboxCursor(page.lane)
            pages.check_page(cursor, page)
            applied = await self._guarded(self.store.apply_mailbox_page(page, page.next_cursor))
            self._hit(ClientPoint.AFTER_BATCH)
        self._report(applied, "mailbox")
        return applied

    def _report(self, applied: Applied, source: Literal["mailbox", "history"]) -> None:
        if applied.added:
            self._emit(MessagesAdded(applied.added, source))
        for c in applied.confirmed:
            self._emit(SendConfirmed(c.cmid, c.message, source))
        for k in applied.conflicts:
            self._emit(SendFailed(k.cmid, k.conversation, *_conflict()))

    # --- pulls ------------------------------------------------------------------------------

    async def pull_history(self, query: HistoryQuery) -> HistoryPage:
        """One page of history as this account (tenant and actor are the account's),
        written to the local store (deduped)."""
        account, api = self._require()
        if query.tenant not in ("", account.tenant) or query.actor not in ("", account.user):
            raise InvalidArgument("history is read as the connected account only")
        q = replace(query, tenant=account.tenant, actor=account.user)
        page = await self._pull(api, lambda a: a.history(q))
        self._report(await self._guarded(self.store.apply_history(page)), "history")
        return page

    async def pull_members(self, request: MemberPageRequest) -> MemberPage:
        account, api = self._require()
        r = request
        return await self._pull(
            api, lambda a: a.list_members(account.tenant, r.conversation, r.page_size, r.page_token)
        )

    async def _pull(self, api: ServerApi | None, call: Callable[[ServerApi], Awaitable[T]]) -> T:
        if api is None:
            raise Offline("no server connection right now; the runtime is reconnecting")
        try:
            return await call(api)
        except CommitError as exc:
            raise pull_failure(exc) from None

    # --- REBUILD ----------------------------------------------------------------------------

    async def begin_rebuild(self, expired: ExpiredCursor) -> RebuildPlan:
        """Entered only from CursorExpired: fetch the authoritative conversation list
        and backfill the history of each of the lane's conversations, listed or held
        here (pending sends and local messages are kept). ``finish_rebuild`` ends it."""
        async with self._rebuild_lock:  # one entry point at a time
            return await self._begin_rebuild(expired)

    async def _begin_rebuild(self, expired: ExpiredCursor) -> RebuildPlan:
        account, api = self._require()
        if expired.lane not in self.expired:
            raise RebuildNotAllowed("begin_rebuild is entered only from CursorExpired")
        if api is None:
            raise Offline("a rebuild needs the server")
        listed = await self.list_conversations(api, account)
        targets = [c.conversation for c in listed if c.lane == expired.lane]
        targets += await self._held_unlisted(expired.lane, {c.conversation for c in listed})
        targets += await self._left_unheld(api, account, expired.lane, set(targets))
        floors = []
        for conversation in targets:
            newest = await self.store.max_seq(conversation)
            floors.append((conversation, max(0, newest - self.config.backfill_overlap)))
        await self.store.begin_rebuild(expired, listed, floors, self.now_ms())
        plan = RebuildPlan(expired.lane, expired.epoch, expired.trim_watermark, tuple(targets))
        self._emit(RebuildStarted(plan))
        self._backfilled = 0
        for progress in await self.store.backfills(expired.lane):
            if not progress.done:
                self._backfilled += await self._backfill(api, account, progress)
                self._hit(ClientPoint.MID_REBUILD)
        return plan

    async def finish_rebuild(self, cursor: MailboxCursor) -> None:
        """Store the lane's new cursor; sync goes on from there and pending sends
        are reconciled next."""
        self._require()
        async with self._rebuild_lock:  # one entry point at a time
            expired = self.expired.get(cursor.lane)
            if expired is None:
                raise RebuildNotAllowed("finish_rebuild follows begin_rebuild")
            if (cursor.epoch, cursor.seq) != (expired.epoch, expired.trim_watermark):
                raise RebuildNotAllowed(
                    "finish_rebuild takes the cursor the expiry named (epoch, trim watermark)"
                )
            await self.store.finish_rebuild(cursor)
            del self.expired[cursor.lane]
            self._emit(RebuildFinished(cursor, self._backfilled))
            self._backfilled = 0

    async def _held_unlisted(self, lane: str, listed: set[str]) -> list[str]:
        """The conversations of ``lane`` this device holds messages of that the list
        lacks: the user left them (or was removed) and may be added again. What was
        committed there while the user was a member, and this device had not read
        yet, is no longer in the new epoch's lane; History still shows it to a
        removed member (the seqs of while it was not one are hidden), so they are
        backfilled like the listed ones. Without this a device back after a new
        epoch keeps a hole there for good once its user is added again."""
        held = await self.store.conversations()
        return [
            v.conversation
            for v in held
            if v.lane == lane and v.conversation not in listed and v.last_seq > 0
        ]

    async def _left_unheld(
        self, api: ServerApi, account: ConnectRequest, lane: str, targeted: set[str]
    ) -> list[str]:
        """The conversations of ``lane`` the user left (ListLeftConversations) that
        are not targeted yet: ones this device held nothing of (a new device, or
        one that read nothing of them before going away). What was committed there
        while the user was a member may have been only in the expired epoch's lane;
        History still shows it to a former member. Bounded by what this device
        read: departures before the newest message it read from the lane (less a
        margin for relay delay) left nothing there it had not read already."""
        newest = await self.store.newest_read_ms(lane)
        since = max(0, newest - int(self.config.rebuild_left_margin_s * 1000)) if newest else 0
        found: list[str] = []
        token = ""
        for _ in range(MAX_LIST_PAGES):
            page = await api.list_left_conversations(account.tenant, account.user, since, 0, token)
            for c in page.conversations:
                if c.lane == lane and c.conversation not in targeted:
                    targeted.add(c.conversation)
                    found.append(c.conversation)
            token = page.next_page_token
            if not token:
                break
        return found

    async def list_conversations(
        self, api: ServerApi, account: ConnectRequest
    ) -> list[ConversationSummary]:
        """The authoritative list of the account's conversations, every page."""
        listed: list[ConversationSummary] = []
        token = ""
        for _ in range(MAX_LIST_PAGES):
            page = await api.list_conversations(account.tenant, account.user, 0, token)
            listed += page.conversations
            token = page.next_page_token
            if not token:
                break
        return listed

    async def _backfill(self, api: ServerApi, account: ConnectRequest, b: Backfill) -> int:
        """Backward pages of one conversation down to its floor; returns messages added."""
        cfg = self.config
        added = 0
        for _ in range(cfg.backfill_cap // cfg.backfill_page + 2):
            query = HistoryQuery(
                account.tenant,
                b.conversation,
                account.user,
                Direction.BACKWARD,
                b.anchor,
                cfg.backfill_page,
            )
            try:
                page = await api.history(query)
            except CommitError as exc:
                if classify(exc) is not Outcome.REFUSED:  # left it since the list was read
                    raise
                page = HistoryPage(b.conversation, Direction.BACKWARD, b.anchor, 0, (), 0, 0)
            fetched = b.fetched + len(page.records)
            done = pages.backfill_done(page, b.floor_seq, fetched, cfg.backfill_cap)
            b = replace(b, anchor=page.next_anchor, fetched=fetched, done=done)
            applied = await self._guarded(self.store.apply_backfill(b, page))
            added += len(applied.added)
            self._report(applied, "history")
            if done:
                break
        return added


def _conflict() -> tuple[str, str]:
    error, _, message = CONFLICT_PROBLEM.partition(": ")
    return error, message
