"""Abandoning a quarantined intent on Redis: one script in the conversation's shard.

The commit hash becomes a tombstone (``st`` ``A``, the logical expiry ``x`` of
the idempotency window, the audit record ``ab``), the member leaves the queue,
the creation view, the attempts and the quarantine, a record written before
the quarantine leaves history, the seq's retention pin is released and the seq
joins the conversation's gap set. Standalone: the key pointer (another shard)
gets the same expiry inside the script; Cluster: right after, by its own script.
"""

from __future__ import annotations

import json
from typing import Any

from backends.redis import codec
from backends.redis.commits import CommitCalls
from backends.redis.lua import script
from service.domain.errors import StoreCorrupt
from service.domain.ids import CommitKey
from service.domain.model import Abandonment, AbandonOutcome

ABANDON = script(
    "abandon_quarantined",
    """#!lua flags=allow-cross-slot-keys
-- KEYS: id commit meta history expiry pinned queue created attempts quarantine gaps [pointer]
-- ARGV: dep shift member window_ms ttl_ms operator reason conversation
--@prologue
--@retention
--@settle
local st = redis.call('HGET', KEYS[2], 'st')
if st == 'A' and live(redis.call('HGET', KEYS[2], 'x')) then
  return {'already', redis.call('HGET', KEYS[2], 'ab') or '{}'}
end
if (not st) or st == '3' or st == 'A' or not redis.call('ZSCORE', KEYS[10], ARGV[3]) then
  return {'refused'}
end
local s = redis.call('HGET', KEYS[2], 's')
local seq = tonumber(s or '')
local audit = cjson.encode({by = ARGV[6], why = ARGV[7], at = now, seq = seq or 0})
settle(KEYS[2], {'st', 'A', 'ab', audit}, now + tonumber(ARGV[4]), ARGV[5], KEYS[12], ARGV[8],
  KEYS[7], KEYS[8], KEYS[9], KEYS[10], ARGV[3])
if seq then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], seq, seq)  -- a record written before quarantine
  redis.call('ZREM', KEYS[6], s)
  redis.call('ZADD', KEYS[11], seq, s)
end
local avail = sweep(KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', '(' .. avail)
return {'abandoned', audit}
""",
)

SCRIPTS = (ABANDON,)


async def abandon_quarantined(
    calls: CommitCalls,
    key: CommitKey,
    operator: str,
    reason: str,
    *,
    window_ms: int,
    ttl_ms: int,
) -> Abandonment:
    """Run ABANDON for ``key`` in the conversation its pointer names."""
    conversation = await calls.pointed_conversation(key)
    if conversation is None:
        return Abandonment(AbandonOutcome.NOT_QUARANTINED)
    ck = calls.keys.conversation(key.tenant, conversation)
    s = ck.shard
    member = calls.keys.queue_member(key.tenant, conversation, key.sender, key.cmid)
    word, rest = await calls.run(
        ABANDON,
        [s.identity, ck.commit(key.sender, key.cmid), ck.meta, ck.history, ck.expiry,
         ck.pinned, s.queue, s.created, s.attempts, s.quarantine, ck.gaps,
         *calls.pointer_keys(key)],
        [member, window_ms, ttl_ms, operator, reason, conversation],
    )  # fmt: skip
    if word == b"refused":
        return Abandonment(AbandonOutcome.NOT_QUARANTINED)
    if word not in (b"abandoned", b"already") or not rest:
        raise StoreCorrupt("redis gave an unexpected reply")
    if word == b"abandoned":
        await calls.expire_pointer(key, conversation, window_ms, ttl_ms)
    outcome = AbandonOutcome.ABANDONED if word == b"abandoned" else AbandonOutcome.ALREADY_ABANDONED
    return _audit(outcome, conversation, rest[0])


def _audit(outcome: AbandonOutcome, conversation: str, raw: Any) -> Abandonment:
    try:
        audit = json.loads(codec.to_str(raw))
        return Abandonment(
            outcome,
            conversation,
            int(audit.get("seq", 0)),
            int(audit.get("at", 0)),
            str(audit.get("by", "")),
            str(audit.get("why", "")),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise StoreCorrupt("an abandon's audit record could not be decoded") from exc
