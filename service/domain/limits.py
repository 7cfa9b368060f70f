"""Request rules: content limits, history page bounds and the per-sender quota.

Defaults (all configurable through ``CommitLimits``):

=====================  ========  ==============================================
rule                   default   error
=====================  ========  ==============================================
inline body            64 KiB    InvalidRequest (also: must not be empty unless
                                 a body reference is given)
body reference uri     2048 B    InvalidRequest; size_bytes 0..1 TiB; sha256
                                 empty or 64 lowercase hex characters
custom_type            64 chars  InvalidRequest; required for CUSTOM, forbidden
                                 otherwise; same characters as ids
mentions               100       InvalidRequest; each a valid user id, no repeats
reply_to               -         InvalidRequest unless empty or a message id
history page           1..200    InvalidRequest; max_bytes 1 KiB..4 MiB;
                                 anchor_seq 0..2^63-1
sends per sender       50/s      QuotaExceeded, burst 200 (0 disables)
=====================  ========  ==============================================
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass

from service.domain.errors import InvalidRequest, QuotaExceeded
from service.domain.ids import check_cmid, check_id
from service.domain.model import AuthenticatedSend, HistoryQuery, MessageType

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MESSAGE_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TB = 1 << 40
MAX_SEQ = (1 << 63) - 1
"""The largest sequence number any backend can hold (a signed 64-bit integer in
Redis and CQL); a larger history anchor is refused before it reaches a store."""


@dataclass(frozen=True, slots=True)
class CommitLimits:
    """Content limits and quotas the committer enforces before reserve."""

    max_inline_body_bytes: int = 64 * 1024
    """Largest inline body; bigger bodies go to an object store by reference."""

    max_body_ref_uri_bytes: int = 2048
    """Longest body reference URI (UTF-8 bytes)."""

    max_custom_type_chars: int = 64
    """Longest custom type name."""

    max_mentions: int = 100
    """Most users one message may mention."""

    max_history_page: int = 200
    """Most records one history page may ask for."""

    max_history_page_bytes: int = 4 * 1024 * 1024
    """Largest byte budget one history page may ask for."""

    sender_rate_per_s: float = 50.0
    """Sustained sends per second per (tenant, sender) on one replica; 0 = off."""

    sender_burst: int = 200
    """Sends a sender may make at once before the rate applies."""


def validate_send(request: AuthenticatedSend, limits: CommitLimits) -> None:
    """Raise InvalidRequest / InvalidClientMessageId for the first broken rule."""
    check_cmid(request.cmid)
    check_id("tenant", request.tenant)
    check_id("sender", request.sender)
    check_id("device", request.device)
    check_id("conversation", request.conversation)
    if request.reply_to and not _MESSAGE_ID_RE.fullmatch(request.reply_to):
        raise InvalidRequest(
            "reply_to must be a message id (36 characters: lowercase hex in 8-4-4-4-12 groups)"
        )
    _validate_content(request, limits)
    if len(request.mentions) > limits.max_mentions:
        raise InvalidRequest(f"at most {limits.max_mentions} mentions are allowed")
    for user in request.mentions:
        check_id("mentions", user)
    if len(set(request.mentions)) != len(request.mentions):
        raise InvalidRequest("mentions must not repeat a user")


def _validate_content(request: AuthenticatedSend, limits: CommitLimits) -> None:
    content = request.content
    if not isinstance(content.message_type, MessageType):
        raise InvalidRequest("content.message_type is not a known message type")
    if content.message_type is MessageType.CUSTOM:
        if not content.custom_type:
            raise InvalidRequest("content.custom_type is required for custom messages")
        if len(content.custom_type) > limits.max_custom_type_chars:
            raise InvalidRequest(
                f"content.custom_type must be at most {limits.max_custom_type_chars} characters"
            )
        check_id("content.custom_type", content.custom_type)
    elif content.custom_type:
        raise InvalidRequest("content.custom_type is only allowed for custom messages")
    ref = content.body_ref
    if ref is None:
        if not content.body:
            raise InvalidRequest("content needs an inline body or a body reference")
        if len(content.body) > limits.max_inline_body_bytes:
            raise InvalidRequest(
                f"content.body must be at most {limits.max_inline_body_bytes} bytes;"
                " send larger bodies by reference"
            )
        return
    if content.body:
        raise InvalidRequest("content must have either an inline body or a reference, not both")
    if not ref.uri or len(ref.uri.encode("utf-8")) > limits.max_body_ref_uri_bytes:
        raise InvalidRequest(
            f"content.body_ref.uri must be 1-{limits.max_body_ref_uri_bytes} bytes"
        )
    if not 0 <= ref.size_bytes <= _TB:
        raise InvalidRequest("content.body_ref.size_bytes must be between 0 and 1 TiB")
    if ref.sha256 and not _SHA256_RE.fullmatch(ref.sha256):
        raise InvalidRequest("content.body_ref.sha256 must be 64 lowercase hex characters")


def validate_history_query(query: HistoryQuery, limits: CommitLimits) -> None:
    """Raise InvalidRequest when a page request is out of bounds."""
    check_id("tenant", query.tenant)
    check_id("conversation", query.conversation)
    check_id("actor", query.actor)
    if not 1 <= query.limit <= limits.max_history_page:
        raise InvalidRequest(f"page limit must be between 1 and {limits.max_history_page}")
    if not 1024 <= query.max_bytes <= limits.max_history_page_bytes:
        raise InvalidRequest(f"max_bytes must be between 1024 and {limits.max_history_page_bytes}")
    if not 0 <= query.anchor_seq <= MAX_SEQ:
        raise InvalidRequest("anchor_seq must be between 0 and 2^63-1")


class SenderQuota:
    """A token bucket per (tenant, sender), kept for the most recent senders.

    Per replica and in memory: it sheds abuse, it is not a billing meter.
    Only fresh reservations are charged: the committer takes a token before
    reserve and refunds it when the reserve was a replay, a retry of an
    unfinished intent or a conflict; a duplicate of a send this replica is
    committing right now takes none. Over quota, a replay is still answered.
    """

    def __init__(self, limits: CommitLimits, max_senders: int = 100_000) -> None:
        self._rate = limits.sender_rate_per_s
        self._burst = float(limits.sender_burst)
        self._max = max_senders
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()

    def take(self, tenant: str, sender: str) -> None:
        """Charge one send or raise QuotaExceeded."""
        if self._rate <= 0:
            return
        now = time.monotonic()
        key = (tenant, sender)
        tokens, last = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            raise QuotaExceeded(
                "sender quota exceeded; slow down", retry_after_s=(1.0 - tokens) / self._rate
            )
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > self._max:
            self._buckets.popitem(last=False)

    def refund(self, tenant: str, sender: str) -> None:
        """Give back the token of a send that turned out to be a replay or a retry
        of an in-flight one (it reserved nothing)."""
        if self._rate <= 0:
            return
        key = (tenant, sender)
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets[key] = (min(self._burst, bucket[0] + 1.0), bucket[1])
