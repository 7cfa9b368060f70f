"""Measure what one committed message costs in Redis.

``measure_committed_record`` commits one message through the real
MessageCommitter on a throwaway key prefix, then reads ``MEMORY USAGE``
(all samples) and ``OBJECT ENCODING`` of its commit hash; it does the same
for a pre-compaction (OUTBOXED) hash in the current digest form and in the
legacy whole-identity form, sizes the key pointer, counts the round trips of
a fresh commit and a replay, and deletes every key it wrote. The throwaway
prefix (``mc-sizing-xxxxxxxx``) is 16 bytes longer than the default ``mc``,
so the figures are slightly pessimistic.

    python -m backends.redis.sizing --url redis://127.0.0.1:6379 --body-bytes 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from typing import Any

from backends.redis import open_link, open_redis_backend
from backends.redis.deployment import initialise
from backends.redis.keys import KeySpace
from backends.redis.link import CALL, RedisLink
from service.domain.committer import MessageCommitter, new_message_id
from service.domain.errors import CommitError, StoreError
from service.domain.limits import CommitLimits
from service.domain.model import (
    AuthenticatedSend,
    CommitState,
    FrozenDeliveryInput,
    MessageContent,
    MessageType,
    ReserveCandidate,
    Reserved,
)
from service.domain.ports import Backend, SystemClock

TENANT, CONVERSATION, SENDER, DEVICE = "tenant-0001", "conv-000001", "user-000001", "device-01"
MAX_CLEANUP_ROUNDS = 1000


def _send(body_bytes: int) -> AuthenticatedSend:
    return AuthenticatedSend(
        tenant=TENANT,
        sender=SENDER,
        device=DEVICE,
        conversation=CONVERSATION,
        cmid=str(uuid.uuid4()),
        content=MessageContent(MessageType.TEXT, b"x" * body_bytes),
    )


def _link(backend: Backend) -> RedisLink:
    link = getattr(backend.outbox, "_link", None)
    if not isinstance(link, RedisLink):
        raise TypeError("not a redis backend")
    return link


async def _describe(link: RedisLink, key: str) -> dict[str, object]:
    usage, encoding = await link.pipeline(
        [("MEMORY", "USAGE", key, "SAMPLES", "0"), ("OBJECT", "ENCODING", key)], write=False
    )
    return {
        "memory_usage_bytes": int(usage),
        "encoding": encoding.decode() if isinstance(encoding, bytes) else str(encoding),
    }


async def _outboxed(backend: Backend, body_bytes: int) -> str:
    """Drive one message to OUTBOXED (the fullest pre-compaction form)."""
    request = _send(body_bytes)
    now = SystemClock().now_ms()
    admission = await backend.membership.admission(TENANT, CONVERSATION, SENDER)
    assert admission is not None
    delivery = FrozenDeliveryInput.at_version(admission.version)
    reserved = await backend.store.reserve(
        request, delivery, ReserveCandidate(new_message_id(now), now)
    )
    if not isinstance(reserved, Reserved):
        raise RuntimeError("a fresh key did not reserve")
    intent = reserved.intent
    await backend.store.put_record(intent)
    recorded = intent.advanced(CommitState.RECORDED)
    await backend.store.mark_outbox_published(recorded, await backend.outbox.publish(recorded))
    return request.cmid


async def _cleanup(link: RedisLink, keys: KeySpace) -> None:
    cursor: Any = 0
    for _ in range(MAX_CLEANUP_ROUNDS):
        cursor, found = await link.call(
            "SCAN", cursor, "MATCH", f"{keys.prefix}:*", "COUNT", 500, write=False
        )
        if found:
            await link.call("DEL", *found, write=True)
        if int(cursor) == 0:
            return


async def measure_committed_record(url: str, body_bytes: int = 100) -> dict[str, object]:
    """Sizes and encodings of a committed hash and of pre-compaction hashes."""
    keys = KeySpace(f"mc-sizing-{uuid.uuid4().hex[:8]}")
    link = open_link(url)
    try:
        await initialise(link, keys.prefix, keys.shards)
    finally:
        await link.close()
    backend = await open_redis_backend(url, prefix=keys.prefix)
    whole = await open_redis_backend(url, prefix=keys.prefix, identity_form="whole")
    link = _link(backend)
    try:
        await backend.membership.create_conversation(TENANT, CONVERSATION, [SENDER, "user-2"])
        committer = MessageCommitter(
            backend.store,
            backend.membership,
            backend.outbox,
            limits=CommitLimits(sender_rate_per_s=0),
        )
        request = _send(body_bytes)
        before = backend.requests[CALL]
        await committer.commit_send(request)
        fresh_calls = backend.requests[CALL] - before
        before = backend.requests[CALL]
        await committer.commit_send(request)
        replay_calls = backend.requests[CALL] - before
        conv = keys.conversation(TENANT, CONVERSATION)
        committed = await _describe(link, conv.commit(SENDER, request.cmid))
        pointer = await _describe(link, keys.pointer(TENANT, SENDER, request.cmid).pointer)
        outboxed = await _describe(link, conv.commit(SENDER, await _outboxed(backend, body_bytes)))
        legacy = await _describe(link, conv.commit(SENDER, await _outboxed(whole, body_bytes)))
        return {
            "body_bytes": body_bytes,
            **committed,
            "precompaction_state": "outboxed",
            "precompaction_memory_usage_bytes": outboxed["memory_usage_bytes"],
            "precompaction_encoding": outboxed["encoding"],
            "legacy_whole_identity_memory_usage_bytes": legacy["memory_usage_bytes"],
            "legacy_whole_identity_encoding": legacy["encoding"],
            "pointer_memory_usage_bytes": pointer["memory_usage_bytes"],
            "pointer_encoding": pointer["encoding"],
            "redis_calls_fresh_commit": fresh_calls,
            "redis_calls_replay": replay_calls,
        }
    finally:
        try:
            await _cleanup(link, keys)
        finally:
            await whole.close()
            await backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backends.redis.sizing",
        description="Measure the Redis memory of one committed message.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("MC_REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="Redis URL (default: $MC_REDIS_URL, else the local default port)",
    )
    parser.add_argument("--body-bytes", type=int, default=100, help="inline body size")
    args = parser.parse_args(argv)
    if not 1 <= args.body_bytes <= CommitLimits().max_inline_body_bytes:
        parser.error("--body-bytes must be between 1 and the inline body limit")
    try:
        result = asyncio.run(measure_committed_record(args.url, args.body_bytes))
    except (StoreError, CommitError) as exc:
        print(f"sizing failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
