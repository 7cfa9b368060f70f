"""A Redis deployment's identity: initialised on purpose, checked all the time.

``initialise`` (``message-committer migrate --backend redis``) is the only
thing that writes a deployment identity: a random id in ``P:meta`` and in
every shard's ``P:{n}:id``. The service never initialises anything itself:
it refuses to start on a Redis without an identity, and its readiness probe
(and every script, per shard) compares the identity with the one it opened,
so a Redis that lost its data (FLUSHALL, an empty replica promoted, a new
volume, a Cluster node replaced empty) turns NOT_SERVING with an operator
message instead of starting seqs again at 1.

``initialise`` on a Redis holding release 1's layout upgrades it in place
(standalone only, which is all release 1 supported): every conversation
moves to its shard, members get version intervals, unfinished intents join
their shard's recovery queue and are pinned against retention, the key
pointers move, and release 1's outbox stream stays readable as the legacy
partition. Each step is idempotent, so an interrupted upgrade is re-run.

``check_eviction``: Redis must not evict (``maxmemory-policy noeviction``):
an evicting Redis drops committed records, key pointers and counters, and a
retried send then becomes a second message.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from backends.redis import codec
from backends.redis.keys import DEFAULT_SHARDS, SCHEMA_VERSION, KeySpace, Release1Keys, dec
from backends.redis.link import RedisLink
from service.domain.errors import StoreMisconfigured, StoreSchemaError, StoreWiped

log = logging.getLogger(__name__)

MAX_SCAN_ROUNDS = 1_000_000
_SCAN_COUNT = 500


@dataclass(frozen=True, slots=True)
class Deployment:
    """What ``P:meta`` says."""

    identity: str
    shards: int


async def read_deployment(link: RedisLink, prefix: str) -> Deployment:
    """The deployment of ``prefix``; StoreSchemaError when it was never initialised."""
    meta = codec.hash_reply(await link.call("HGETALL", f"{prefix}:meta", write=False))
    if not meta:
        if await link.call("EXISTS", Release1Keys(prefix).schema, write=False):
            raise StoreSchemaError(
                "redis: the data is in release 1's layout; run `message-committer migrate"
                " --backend redis` to upgrade it"
            )
        raise StoreSchemaError(
            "redis: no deployment is initialised under this prefix; run `message-committer"
            " migrate --backend redis` once to initialise it"
        )
    if meta.get(b"schema") != SCHEMA_VERSION.encode():
        raise StoreSchemaError("redis: the data was written by another layout version")
    return Deployment(codec.to_str(meta.get(b"deployment")), codec.to_int(meta.get(b"shards")))


async def check_identity(link: RedisLink, keys: KeySpace, identity: str) -> None:
    """StoreWiped unless ``P:meta`` and every shard still hold ``identity``."""
    commands: list[tuple[Any, ...]] = [("HGET", keys.meta, "deployment")]
    commands += [("GET", s.identity) for s in keys.all_shards()]
    replies = await link.pipeline(commands, write=False)
    expected = identity.encode()
    lost = sum(1 for reply in replies if reply != expected)
    if lost:
        raise StoreWiped(f"redis: {lost} deployment markers are missing or different")


async def check_eviction(link: RedisLink, *, allow: bool) -> None:
    """StoreMisconfigured unless every server's maxmemory-policy is noeviction."""
    for reply in await link.every_primary("INFO", "memory"):
        policy = _policy(reply)
        if policy == "noeviction":
            continue
        if allow:
            log.warning(
                "redis maxmemory-policy is %s and MC_REDIS_ALLOW_EVICTION is set: evicted"
                " records make retried sends into second messages; throwaway data only",
                policy,
            )
            continue
        raise StoreMisconfigured(
            f"redis: maxmemory-policy is {policy}",
            f"Redis's maxmemory-policy is {policy}: an evicting Redis loses committed records"
            " and counters; set maxmemory-policy noeviction (or MC_REDIS_ALLOW_EVICTION=true"
            " for throwaway data)",
        )


def _policy(reply: Any) -> str:
    """``maxmemory_policy`` from an INFO reply (parsed by the client, or raw text)."""
    if isinstance(reply, dict):
        return str(reply.get("maxmemory_policy", "unknown"))
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    for line in text.splitlines():
        if line.startswith("maxmemory_policy:"):
            return line.partition(":")[2].strip()
    return "unknown"


WIPED_REFUSAL = (
    "redis: this prefix holds no deployment, but the configuration names one"
    " (MC_REDIS_DEPLOYMENT or MC_REDIS_DEPLOYMENT_FILE): it has served before and its"
    " data was wiped; restore the data, or pass --new-deployment to start over on"
    " purpose (acknowledged sends are then forgotten)"
)


async def initialise(
    link: RedisLink,
    prefix: str,
    shards: int = DEFAULT_SHARDS,
    *,
    accept_lost_shards: bool = False,
    expected: str = "",
    new_deployment: bool = False,
) -> tuple[Deployment, str]:
    """Initialise, upgrade or verify the deployment of ``prefix``; (deployment, what was done).

    ``expected`` is the identity the service's configuration names (the wipe cannot
    take it): a prefix holding another identity is refused, and so is an empty
    prefix, which has then served before, unless ``new_deployment``."""
    existing = codec.hash_reply(await link.call("HGETALL", f"{prefix}:meta", write=False))
    if existing:
        deployment = await read_deployment(link, prefix)
        if expected and deployment.identity != expected:
            raise StoreSchemaError(
                "redis: this prefix holds another deployment than the configuration names;"
                " point MC_REDIS_DEPLOYMENT at the right one (or the right Redis)"
            )
        keys = KeySpace(prefix, deployment.shards)
        try:
            await check_identity(link, keys, deployment.identity)
        except StoreWiped:
            if not accept_lost_shards:
                raise
            await _write_markers(link, keys, deployment.identity)
            return deployment, "re-marked lost shards (their data is gone)"
        return deployment, "already initialised"
    old = Release1Keys(prefix)
    release1 = await link.call("GET", old.schema, write=False) == b"1"
    if expected and not new_deployment and not release1:
        raise StoreSchemaError(WIPED_REFUSAL)
    if release1:
        if link.cluster:
            raise StoreSchemaError("redis: release 1 data can only be upgraded on standalone Redis")
        keys = KeySpace(prefix, shards)
        identity = uuid.uuid4().hex
        moved = await _upgrade_release1(link, keys, old, identity)
        return Deployment(identity, shards), f"upgraded release 1 data ({moved} conversations)"
    if await _any_key(link, prefix):
        raise StoreSchemaError(
            "redis: keys of this prefix exist but no deployment identity does; refusing to"
            " initialise over data that may be partial"
        )
    keys = KeySpace(prefix, shards)
    identity = uuid.uuid4().hex
    await _write_markers(link, keys, identity)
    return Deployment(identity, shards), "initialised a new deployment"


async def _write_markers(link: RedisLink, keys: KeySpace, identity: str) -> None:
    """Every shard's identity first, ``P:meta`` last (it is what says "initialised")."""
    await link.pipeline([("SET", s.identity, identity) for s in keys.all_shards()], write=True)
    await link.call(
        "HSET", keys.meta, "schema", SCHEMA_VERSION, "deployment", identity,
        "shards", keys.shards, "created_ms", time.time_ns() // 1_000_000,
        write=True,
    )  # fmt: skip


async def _any_key(link: RedisLink, prefix: str) -> bool:
    """Whether any key of ``prefix`` exists (on any server)."""
    seen = 0
    async for _ in link.client.scan_iter(match=f"{prefix}:*", count=_SCAN_COUNT):
        seen += 1
        break
    return seen > 0


async def _scan(link: RedisLink, pattern: str) -> list[bytes]:
    found: list[bytes] = []
    cursor: Any = 0
    for _ in range(MAX_SCAN_ROUNDS):
        cursor, batch = await link.call(
            "SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT, write=False
        )
        found += [k for k in batch if isinstance(k, bytes)]
        if cursor in (0, b"0"):
            return found
    raise StoreSchemaError("redis: the keyspace scan did not end")


async def _upgrade_release1(
    link: RedisLink, keys: KeySpace, old: Release1Keys, identity: str
) -> int:
    """Move every release-1 conversation into layout 2 (idempotent; see module doc)."""
    queued = {
        member: str(int(score)).encode()
        for member, score in codec.score_pairs(
            await link.call("ZRANGE", old.recovery, 0, -1, "WITHSCORES", write=False)
        )
    }
    metas = await _scan(link, old.meta_pattern)
    for meta in metas:
        await _upgrade_conversation(link, keys, old, codec.to_str(meta), queued)
    await _write_markers(link, keys, identity)
    await link.call("DEL", old.recovery, old.schema, write=True)
    return len(metas)


async def _upgrade_conversation(
    link: RedisLink, keys: KeySpace, old: Release1Keys, meta_key: str, queued: dict[bytes, bytes]
) -> None:
    base = old.conversation_base(meta_key)
    tenant, conversation = old.parse_base(base)
    ck = keys.conversation(tenant, conversation)
    meta = codec.hash_reply(await link.call("HGETALL", meta_key, write=False))
    version = codec.to_int(meta.get(b"v", b"1"))
    members = [m for m in await link.call("SMEMBERS", f"{base}:u", write=False) or []]
    for i in range(0, len(members), 1000):
        chunk = members[i : i + 1000]
        commands: list[tuple[Any, ...]] = [("ZADD", ck.users, *[x for m in chunk for x in (0, m)])]
        commands.append(("HSET", ck.intervals, *[x for m in chunk for x in (m, str(version))]))
        await link.pipeline(commands, write=True)
    for suffix, target in ((":h", ck.history), (":x", ck.expiry)):
        if await link.call("EXISTS", base + suffix, write=False):
            await link.call("RENAME", base + suffix, target, write=True)
    for commit in await _scan(link, f"{base}:c:*"):
        await _upgrade_commit(
            link, keys, old, ck, tenant, conversation, codec.to_str(commit), queued
        )
    await link.call(
        "HSET", ck.meta, "v", version, "f", version, "mc", len(members),
        "s", meta.get(b"s", b"0"), "a", meta.get(b"a", b"1"), "wc", 0,
        write=True,
    )  # fmt: skip
    await link.call("DEL", meta_key, f"{base}:u", write=True)


async def _upgrade_commit(
    link: RedisLink,
    keys: KeySpace,
    old: Release1Keys,
    ck: Any,
    tenant: str,
    conversation: str,
    commit: str,
    queued: dict[bytes, bytes],
) -> None:
    sender_enc, cmid_enc = commit.rsplit(":", 2)[-2:]
    sender, cmid = dec(sender_enc), dec(cmid_enc)
    target = ck.commit(sender, cmid)
    await link.call("RENAME", commit, target, write=True)
    pointer = old.pointer(tenant, sender, cmid)
    if await link.call("EXISTS", pointer, write=False):
        await link.call("RENAME", pointer, keys.pointer(tenant, sender, cmid).pointer, write=True)
    fields = codec.hash_reply(await link.call("HGETALL", target, write=False))
    if fields.get(b"st") == b"3":
        return
    member = keys.queue_member(tenant, conversation, sender, cmid)
    created = fields.get(b"ca") or queued.get(member.encode()) or b"0"
    seq = fields.get(b"s", b"0")
    await link.pipeline(
        [
            ("ZADD", ck.pinned, seq, seq),
            ("ZADD", ck.shard.queue, created, member),
            ("ZADD", ck.shard.created, created, member),
        ],
        write=True,
    )
