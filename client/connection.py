"""The connection cycle of one ``ClientRuntime`` (see ``client.runtime``).

``Supervisor.run`` loops: connect, sync (rebuilding expired lanes), reconcile
pending sends by cmid, go ONLINE; whatever ends a connection (a failed call,
an ACK timeout, a PONG timeout, the stream ending) is logged by its class,
the state goes to DISCONNECTED, and after a jittered backoff the cycle starts
again. Every loop is bounded: pages per lane, rebuilds per connection,
repairs of a damaged store per runtime; waits are bounded by the PONG
deadline. A send has no attempt limit (an unknown outcome is never a
failure); the reconnect backoff grows until a connection stayed ONLINE for
``stable_online_s`` with a heartbeat seen. Whatever stops the cycle itself
is an event with a reason (CLOSED), never a silent, blocked ``next_event``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from client import pages
from client.errors import ClientRuntimeError, LocalStoreCorrupt
from client.events import CursorExpired, SendFailed
from client.faults import ClientCrash, ClientPoint
from client.model import (
    INBOX,
    ExpiredCursor,
    Heartbeat,
    MailboxCursor,
    MailboxHint,
    PendingSend,
)
from client.outcomes import Outcome, classify, describe, is_timeout, retry_wait_s
from client.state import Backoff, ConnectionState, Liveness
from client.transport import CallTimeouts, ServerApi
from service.domain.errors import CommitError
from service.domain.errors import CursorExpired as ServerCursorExpired
from service.domain.model import Direction, HistoryQuery
from service.tasks import cancel_and_wait, wait_event

if TYPE_CHECKING:
    from client.runtime import ClientRuntime

log = logging.getLogger(__name__)

S = ConnectionState
MAX_REPAIRS = 3
"""Resets of a store found damaged in use, per runtime; past it the runtime stops."""
HISTORY_CHECK_SLACK_MS = 60_000
"""How far before a send's first attempt the history look-up reads (clock skew)."""


class LeaveOnline(Exception):
    """This connection is over; ``reason`` says why (never content or addresses)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Expired(Exception):
    def __init__(self, lane: str) -> None:
        super().__init__(lane)
        self.lane = lane


class Supervisor:
    def __init__(self, runtime: ClientRuntime) -> None:
        self.rt = runtime
        self.cfg = runtime.config
        self.timeouts = CallTimeouts(self.cfg.ack_timeout_s, self.cfg.rpc_timeout_s)
        self.account = runtime.account
        self.backoff = Backoff(self.cfg.reconnect_initial_s, self.cfg.reconnect_max_s, runtime.rng)
        self.loop = asyncio.get_running_loop()

    async def run(self) -> None:
        """The cycle; whatever ends it is an event: ``ConnectionChanged`` with a
        reason, and CLOSED (then RuntimeStopped) when it cannot go on."""
        try:
            await self._cycles()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: stop with a reason, never hang the host
            self.rt.unexpected[type(exc).__name__] += 1
            log.exception("client runtime: the supervisor stopped on %s", type(exc).__name__)
            self.rt._fail(f"the connection cycle failed ({type(exc).__name__})")

    async def _cycles(self) -> None:
        rt = self.rt
        repairs = 0
        for _attempt in range(1_000_000_000):  # a runtime's life; each turn waits a backoff
            if rt.stopped:
                return  # closed or crashed: no new connection
            rt._set_state(S.CONNECTING)
            reason = ""
            corrupt: LocalStoreCorrupt | None = None
            api: ServerApi | None = None
            try:
                api = rt.connector.open(self.timeouts)
                rt.api = api
                await api.wait_ready()
                await self.session(api)
            except ClientCrash as crash:
                rt._die(crash)
                return
            except LeaveOnline as exc:
                reason = exc.reason
            except LocalStoreCorrupt as exc:
                corrupt, reason = exc, describe(exc)
            except (CommitError, ClientRuntimeError) as exc:
                reason = describe(exc)
            except Exception as exc:  # a bug: keep the runtime alive, but say so loudly
                rt.unexpected[type(exc).__name__] += 1
                log.exception("client runtime: unexpected %s", type(exc).__name__)
                reason = f"unexpected {type(exc).__name__}"
            finally:
                rt.api = None
                if api is not None:
                    with contextlib.suppress(Exception):
                        await api.close()
            rt._set_state(S.DISCONNECTED, reason)
            if corrupt is not None:
                repairs += 1
                if repairs > MAX_REPAIRS:
                    rt._fail("the local store stays damaged after repairs")
                    return
                await rt._repair_store(corrupt)
            await asyncio.sleep(self.backoff.next_delay())

    async def session(self, api: ServerApi) -> None:
        rebuilds = 0
        lanes = await self.listed_lanes(api)
        while True:  # each turn: sync, reconcile, online until a CursorExpired
            self.rt._set_state(S.SYNCING)
            for _ in range(self.cfg.max_rebuilds_per_connection + 1):
                try:
                    await self.sync_all(api, lanes)
                    break
                except _Expired as exc:
                    rebuilds += 1
                    if rebuilds > self.cfg.max_rebuilds_per_connection:
                        raise LeaveOnline("too many rebuilds on one connection") from None
                    await self.rebuild(exc.lane)
            await self.reconcile(api)
            self.rt._set_state(S.ONLINE)
            await self.online(api, unhinted=set(lanes))

    # --- sync and rebuild -------------------------------------------------------------

    async def listed_lanes(self, api: ServerApi) -> list[str]:
        """The lanes of the big conversations the user is in (ListConversations), so a
        lane is synced from its first entry, before any hint names it."""
        listed = await self.rt.list_conversations(api, self.account)
        return [c.lane for c in listed if c.lane != INBOX]

    async def sync_all(self, api: ServerApi, listed: list[str]) -> None:
        known = [c.lane for c in await self.rt.store.cursors()] + list(self.rt.expired)
        for lane in pages.lanes_to_sync(known + listed):
            await self.sync_lane(api, lane)

    async def sync_lane(self, api: ServerApi, lane: str) -> None:
        rt, a = self.rt, self.account
        if lane in rt.expired:
            raise _Expired(lane)
        for _ in range(self.cfg.max_sync_pages):
            cursor = await rt.store.cursor(lane) or MailboxCursor(lane)
            try:
                page = await api.sync(a.tenant, a.user, cursor, self.cfg.sync_limit)
            except ServerCursorExpired as exc:
                expired = ExpiredCursor(lane, exc.epoch, exc.trim_watermark, exc.why)
                rt.expired[lane] = expired
                rt._emit(CursorExpired(lane, exc.epoch, exc.trim_watermark, exc.why))
                raise _Expired(lane) from None
            except CommitError as exc:
                if lane != INBOX and classify(exc) is Outcome.REFUSED:
                    return  # a big conversation the user left: nothing to sync
                raise
            await rt.apply_mailbox_batch(page)
            if not page.more:
                return
        log.warning("client runtime: lane sync stopped at its page bound")

    async def rebuild(self, lane: str) -> None:
        rt = self.rt
        expired = rt.expired[lane]
        rt._set_state(S.REBUILDING, f"cursor of {lane} expired")
        await rt.begin_rebuild(expired)
        await rt.finish_rebuild(MailboxCursor(lane, expired.epoch, expired.trim_watermark))
        rt._set_state(S.SYNCING, "rebuilt")

    # --- reconcile --------------------------------------------------------------------

    async def reconcile(self, api: ServerApi) -> None:
        """Every pending send that ever went out, by its own cmid (oldest first)."""
        rt, user = self.rt, self.account.user
        for p in await rt.store.pending():
            if p.parked or p.first_attempt_ms == 0:
                continue  # a send that never went out is simply sent
            own = await rt.store.find_own(user, p.cmid)
            if own is not None:
                await rt._settle_found(p, own.record)
                continue
            try:
                existing = await api.find_existing(p.send)
            except CommitError as exc:
                await self.failed(p, exc)
                continue
            if existing.message is not None:
                rt._hit(ClientPoint.RESUMED_BEFORE_RESOLVE)
                await rt._confirm(p, existing.message, "resume")
                continue
            age_ms = rt.now_ms() - p.first_attempt_ms
            if age_ms > self.history_check_after_ms(existing.idempotency_window_ms):
                await self.in_history(api, p)
            # not found: it stays pending and goes out again with the same id

    def history_check_after_ms(self, window_ms: int) -> float:
        """How old a send "not found" by ResumeExisting must be before its
        history is read: the server may have forgotten a key that old. Tied to
        the window the server states (with a seventh of it, at least a minute,
        as margin); ``history_check_after_s`` only for a server that states none."""
        if window_ms <= 0:
            return self.cfg.history_check_after_s * 1000
        return max(0, window_ms - max(HISTORY_CHECK_SLACK_MS, window_ms // 7))

    async def in_history(self, api: ServerApi, p: PendingSend) -> bool:
        """Look for the send's cmid in its conversation's history, newest first,
        back to its first attempt (the server no longer knows keys that old). A
        page that has it is applied: its own identity confirms the send, another
        identity parks it as a conflict (``LocalStore.apply_history``)."""
        a, rt = self.account, self.rt
        anchor = 0
        since = p.first_attempt_ms - HISTORY_CHECK_SLACK_MS
        for _ in range(self.cfg.history_check_pages):
            query = HistoryQuery(a.tenant, p.conversation, a.user, Direction.BACKWARD, anchor)
            page = await api.history(query)
            hit = any(r.sender == a.user and r.cmid == p.cmid for r in page.records)
            if hit:
                rt._report(await rt._guarded(rt.store.apply_history(page)), "history")
                return True
            older = bool(page.records) and all(r.server_ts_ms < since for r in page.records)
            if not page.next_anchor or older:  # a page of hidden records only goes on
                return False
            anchor = page.next_anchor
        return False

    # --- online -----------------------------------------------------------------------

    async def online(self, api: ServerApi, unhinted: set[str] | None = None) -> None:
        """Send and follow hints until the connection ends (raises) or a lane's
        cursor expired (returns: the session syncs and rebuilds).

        ``unhinted`` are listed lanes the stream has not hinted yet. A server's
        Subscribe looks for new big-conversation lanes only now and then, so a lane
        listed before its first entry is synced at every heartbeat until a hint
        names it: its first messages wait one heartbeat, not the server's refresh."""
        rt = self.rt
        online_at = self.loop.time()
        stable = False
        liveness = Liveness(self.cfg.pong_timeout_s, online_at)
        reader = self.read_stream(api, liveness, set() if unhinted is None else unhinted)
        stream = asyncio.create_task(reader, name="client-subscribe")
        try:
            for _ in range(1_000_000_000):  # a connection's life; each turn waits or works
                lasted = self.loop.time() - online_at
                if (
                    not stable
                    and lasted >= self.cfg.stable_online_s
                    and liveness.seen_since(online_at)
                ):
                    self.backoff.reset()  # a stable connection with a round trip on it
                    stable = True
                if stream.done():
                    stream.result()
                    raise LeaveOnline("the Subscribe stream ended")
                if liveness.expired(self.loop.time()):
                    raise LeaveOnline(f"PONG timeout: no heartbeat for {self.cfg.pong_timeout_s}s")
                if rt.sync_wanted:
                    lanes, rt.sync_wanted = sorted(rt.sync_wanted), set()
                    try:
                        for lane in lanes:
                            await self.sync_lane(api, lane)
                    except _Expired:
                        return
                    continue
                if await self.send_next(api):
                    continue
                rt.wake.clear()
                if rt.sync_wanted:
                    continue
                await wait_event(rt.wake, max(0.05, liveness.remaining(self.loop.time())))
        finally:
            await cancel_and_wait(stream)

    async def read_stream(self, api: ServerApi, liveness: Liveness, unhinted: set[str]) -> None:
        """Hints only ever ask for a sync; the stream's every message is a PONG."""
        rt, a = self.rt, self.account
        try:
            async for item in api.subscribe(a.tenant, a.user, self.cfg.heartbeat_s):
                liveness.seen(self.loop.time())
                if isinstance(item, Heartbeat):
                    rt.sync_wanted.update(unhinted)
                elif isinstance(item, MailboxHint):
                    unhinted.discard(item.lane)
                    cursor = await rt.store.cursor(item.lane)
                    if cursor is None or cursor.epoch != item.epoch or item.seq > cursor.seq:
                        rt.sync_wanted.add(item.lane)
                rt.wake.set()
        except CommitError as exc:
            raise LeaveOnline(f"Subscribe failed: {describe(exc)}") from None
        finally:
            rt.wake.set()

    async def send_next(self, api: ServerApi) -> bool:
        """Send the oldest sendable pending send; False when there is none.

        There is no attempt limit: an unknown outcome leaves ONLINE (the
        connection backoff, then reconciliation), a RETRY_LATER waits a doubling
        delay; only the server's definite "no" parks a send."""
        rt = self.rt
        p = await rt.store.next_sendable()
        if p is None:
            return False
        await rt.store.mark_attempt(p.cmid, rt.now_ms())
        rt._hit(ClientPoint.ATTEMPT_BEFORE_SEND)
        try:
            committed = await api.commit(p.send)
        except CommitError as exc:
            if is_timeout(exc):
                raise LeaveOnline(f"ACK timeout after {self.cfg.ack_timeout_s}s") from None
            await self.failed(p, exc)
            return True
        rt._hit(ClientPoint.SENT_BEFORE_ACK)
        await rt._confirm(p, committed, "ack")
        return True

    async def failed(self, p: PendingSend, exc: CommitError) -> None:
        outcome = classify(exc)
        if outcome is Outcome.REFUSED:
            await self.park(p, type(exc).__name__, str(exc))
        elif outcome is Outcome.RETRY_LATER:
            cfg = self.cfg
            wait = retry_wait_s(
                exc,
                p.attempts - 1,
                self.rt.rng,
                initial_s=cfg.retry_initial_s,
                maximum_s=cfg.retry_max_s,
            )
            await asyncio.sleep(wait)
        else:
            raise LeaveOnline(f"send failed: {describe(exc)}")

    async def park(self, p: PendingSend, error: str, message: str) -> None:
        await self.rt.store.park_pending(p.cmid, f"{error}: {message}")
        self.rt._emit(SendFailed(p.cmid, p.conversation, error, message))
