"""The client runtime's settings: one frozen dataclass, every field documented."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How the runtime talks to the server and when it gives up on a connection."""

    ack_timeout_s: float = 10.0
    """Deadline of one Commit; past it the ACK counts as lost: the runtime leaves
    ONLINE, reconnects and reconciles the send by its cmid."""

    rpc_timeout_s: float = 10.0
    """Deadline of every other call (Sync, ResumeExisting, History, lists) and of
    the connection coming up."""

    heartbeat_s: int = 5
    """Seconds between the Subscribe stream's heartbeats (asked of the server, 1-60)."""

    pong_timeout_s: float = 12.0
    """Longest silence of the Subscribe stream while ONLINE; past it the runtime
    leaves ONLINE and reconnects (the PONG timeout)."""

    reconnect_initial_s: float = 0.25
    """First reconnect delay; doubles per failed attempt (jittered to half-full)."""

    reconnect_max_s: float = 15.0
    """Longest reconnect delay."""

    sync_limit: int = 100
    """Events per Sync page (the server never splits a group)."""

    max_sync_pages: int = 10_000
    """Most Sync pages per lane in one round (a bound, not a target)."""

    backfill_page: int = 100
    """Messages per history page of a REBUILD's backfill."""

    backfill_cap: int = 1000
    """Most messages a REBUILD fetches per conversation; older ones are pulled
    on demand (``pull_history``)."""

    backfill_overlap: int = 100
    """How far below the newest seq it held the backfill of a conversation
    reaches, for messages committed out of seq order."""

    rebuild_left_margin_s: float = 86_400.0
    """A REBUILD also backfills the conversations the user left since the newest
    message this device read from the lane, less this margin (the longest relay
    delay it allows for): those it may have missed. With nothing read, all of
    them (the server lists none older than History's retention)."""

    history_check_after_s: float = 6 * 86_400.0
    """Only for a server that does not state its idempotency window in
    ResumeExisting's answer: a pending send first sent longer ago than this,
    and not found by ResumeExisting, is looked for in its conversation's
    history before it goes out again. A server that states its window
    (``idempotency_window_ms``) sets this bound itself: the window less a
    seventh of it (at least a minute)."""

    history_check_pages: int = 20
    """Most history pages that look-up reads."""

    retry_initial_s: float = 0.2
    """First wait before a send the server could not finish yet (Recoverable, a
    quota) goes again; doubles per retry of that send, jittered to half-full."""

    retry_max_s: float = 5.0
    """Longest such wait (a quota's hint is capped by it too). There is no
    attempt limit: only a definite refusal parks a send."""

    stable_online_s: float = 10.0
    """How long a connection must stay ONLINE, with a heartbeat seen, before the
    reconnect backoff starts again from ``reconnect_initial_s`` (a connection
    that reaches ONLINE and fails at once keeps backing off)."""

    max_rebuilds_per_connection: int = 5
    """REBUILDs one connection may run before it gives up and backs off."""

    event_capacity: int = 10_000
    """Events kept for a host that does not read; beyond, the oldest are dropped."""

    def validate(self) -> RuntimeConfig:
        if not 1 <= self.heartbeat_s <= 60:
            raise ValueError("heartbeat_s must be 1 to 60")
        if self.pong_timeout_s <= self.heartbeat_s:
            raise ValueError("pong_timeout_s must be longer than heartbeat_s")
        if min(self.ack_timeout_s, self.rpc_timeout_s, self.reconnect_initial_s) <= 0:
            raise ValueError("timeouts and delays must be positive")
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ValueError("retry_initial_s must be positive and at most retry_max_s")
        if self.rebuild_left_margin_s < 0:
            raise ValueError("rebuild_left_margin_s must not be negative")
        if not 1 <= self.sync_limit <= 1000 or not 1 <= self.backfill_page <= 200:
            raise ValueError("sync_limit must be 1-1000 and backfill_page 1-200")
        return self
