"""The connection state machine and the reconnect backoff (pure, no I/O).

::

                 connect                 channel up            synced + reconciled
  DISCONNECTED ──────────▶ CONNECTING ──────────▶ SYNCING ─────────────────────▶ ONLINE
       ▲                       │                  │   ▲                            │
       │   failure, timeout    │                  │   │ finish_rebuild             │ CursorExpired
       └───────────────────────┴──────────────────┤   │                            │ while online
       ▲                                          ▼   │                            ▼
       │                                        REBUILDING ◀──────────────────── SYNCING
       └──── ACK timeout, PONG timeout, stream or RPC failure ◀──────────────── ONLINE

Every state can go to CLOSED (``close``, or an injected crash). ONLINE is
left on an ACK timeout (a Commit past its deadline), a PONG timeout (no
heartbeat from the Subscribe stream in time), or any transport failure; the
runtime then waits a jittered, doubling backoff and connects again, so it
never stays ONLINE on a dead connection.
"""

from __future__ import annotations

import enum
import random


class ConnectionState(enum.StrEnum):
    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    SYNCING = "syncing"
    REBUILDING = "rebuilding"
    ONLINE = "online"
    CLOSED = "closed"


S = ConnectionState
TRANSITIONS: dict[ConnectionState, frozenset[ConnectionState]] = {
    S.DISCONNECTED: frozenset({S.CONNECTING, S.CLOSED}),
    S.CONNECTING: frozenset({S.SYNCING, S.DISCONNECTED, S.CLOSED}),
    S.SYNCING: frozenset({S.REBUILDING, S.ONLINE, S.DISCONNECTED, S.CLOSED}),
    S.REBUILDING: frozenset({S.SYNCING, S.DISCONNECTED, S.CLOSED}),
    S.ONLINE: frozenset({S.SYNCING, S.DISCONNECTED, S.CLOSED}),
    S.CLOSED: frozenset(),
}


class IllegalStateChange(AssertionError):
    """A transition the table does not allow: a bug in the runtime."""


def check_transition(current: ConnectionState, target: ConnectionState) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalStateChange(f"{current.value} -> {target.value} is not a legal transition")


class Backoff:
    """Jittered exponential delays between reconnect attempts.

    The n-th delay is uniform in [d/2, d] with d = min(initial * 2**n, maximum);
    ``reset`` once a connection stayed ONLINE for a stable period with a
    successful round trip (``Supervisor.online``), never merely on reaching it.
    """

    def __init__(self, initial_s: float, maximum_s: float, rng: random.Random) -> None:
        if not 0 < initial_s <= maximum_s:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self._initial = initial_s
        self._maximum = maximum_s
        self._current = initial_s
        self._rng = rng

    def next_delay(self) -> float:
        delay = self._rng.uniform(self._current / 2, self._current)
        self._current = min(self._current * 2, self._maximum)
        return delay

    def reset(self) -> None:
        self._current = self._initial


class Liveness:
    """The PONG rule: the stream must show a sign of life every ``timeout_s``."""

    def __init__(self, timeout_s: float, now: float) -> None:
        self._timeout = timeout_s
        self._last = now

    def seen(self, now: float) -> None:
        self._last = now

    def seen_since(self, moment: float) -> bool:
        """Whether the stream showed a sign of life after ``moment``."""
        return self._last > moment

    def expired(self, now: float) -> bool:
        return now - self._last > self._timeout

    def remaining(self, now: float) -> float:
        return max(0.0, self._timeout - (now - self._last))
