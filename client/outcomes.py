"""What a failed call means for a pending send (pure).

==============  ===========================================  =====================
outcome         errors                                       the runtime
==============  ===========================================  =====================
REFUSED         InvalidRequest (and InvalidClientMessageId),  parks the send
                NotAMember, ConversationNotFound,
                IdempotencyConflict, RequestTooLarge
RETRY_LATER     Recoverable (the key is unfinished),          waits a doubling,
                QuotaExceeded                                 jittered delay (the
                                                              quota's hint at
                                                              least, 5 s at most),
                                                              retries the same
                                                              send, no limit
CONNECTION      Unavailable, a DEADLINE_EXCEEDED (the ACK     leaves ONLINE,
                timeout), INTERNAL, anything else: the        reconnects, then
                outcome is unknown                            reconciles by cmid
==============  ===========================================  =====================

An unknown outcome is never a failure of the send: only the server's "no"
parks it; everything else is settled by reconciliation after a reconnect.
"""

from __future__ import annotations

import enum
import random

import grpc

from client.errors import ClientRuntimeError, Offline, ServerRejected
from service.api.errors import RemoteError, RequestTooLarge
from service.domain.errors import (
    ConversationNotFound,
    IdempotencyConflict,
    InvalidRequest,
    NotAMember,
    QuotaExceeded,
    Recoverable,
)

MAX_RETRY_WAIT_S = 5.0


class Outcome(enum.Enum):
    REFUSED = "refused"
    RETRY_LATER = "retry_later"
    CONNECTION = "connection"


_REFUSED = (InvalidRequest, NotAMember, ConversationNotFound, IdempotencyConflict, RequestTooLarge)


def classify(exc: BaseException) -> Outcome:
    if isinstance(exc, _REFUSED):
        return Outcome.REFUSED
    if isinstance(exc, Recoverable | QuotaExceeded):
        return Outcome.RETRY_LATER
    return Outcome.CONNECTION


def retry_wait_s(
    exc: BaseException,
    retries: int = 0,
    rng: random.Random | None = None,
    *,
    initial_s: float = 0.2,
    maximum_s: float = MAX_RETRY_WAIT_S,
) -> float:
    """How long to wait before the same send again after its ``retries``-th
    RETRY_LATER in a row: ``initial_s`` doubling per retry up to ``maximum_s``,
    jittered to [d/2, d] when ``rng`` is given; a quota's ``retry_after_s`` is a
    floor (``maximum_s`` still bounds it)."""
    delay: float = min(initial_s * 2.0 ** min(max(retries, 0), 30), maximum_s)
    if rng is not None:
        delay = rng.uniform(delay / 2, delay)
    hint = float(exc.retry_after_s) if isinstance(exc, QuotaExceeded) else 0.0
    return min(max(hint, delay, 0.001), maximum_s)


def pull_failure(exc: Exception) -> ClientRuntimeError:
    """What a failed pull (history, members) raises to the host: ServerRejected
    only for the server's definite "no"; anything else (UNAVAILABLE, a
    deadline, CANCELLED, INTERNAL, a quota, an unfinished key) is Offline,
    which says that trying again later can help."""
    if classify(exc) is Outcome.REFUSED:
        return ServerRejected(exc)
    return Offline(f"the pull failed for now ({describe(exc)}); try again")


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, RemoteError) and exc.code is grpc.StatusCode.DEADLINE_EXCEEDED


def describe(exc: BaseException) -> str:
    """A short, safe text for an event or a log: the class and the server's message."""
    if is_timeout(exc):
        return "DeadlineExceeded"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
