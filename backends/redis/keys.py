"""Key layout of the Redis backend (layout 2).

Every key starts with the configured prefix ``P`` (default ``mc``; 1-64
characters from ``A-Z a-z 0-9 . _ -``, so it never contains ``:``, ``{`` or
``}``). Identifiers are *encoded*, never concatenated raw: every byte of the
UTF-8 form outside ``A-Z a-z 0-9 . _ ~ -`` becomes ``%XX`` (so ``:``, ``%``,
``{`` and ``}`` can never appear in an encoded id). The encoding is
injective and ``:`` is a safe separator, so two different id tuples never
share a key, across tenants or across key kinds. Below ``T`` ``C`` ``S``
``K`` are the encoded tenant, conversation, sender and cmid.

**Shards.** A deployment has ``N`` shards (chosen when it is initialised,
default 128, kept in ``P:meta``). A conversation lives in shard
``crc32("T:C") mod N`` and a key pointer in shard ``crc32("T:S:K") mod N``;
every key of shard ``n`` carries the hash tag ``{n}``, so on a Redis Cluster a
shard is one slot and every script touches one slot only (the key pointer is
the one thing reserve and commit need from another shard: on a Cluster it is
claimed and expired in separate steps, see ``docs/redis.md``).

==========================  =======  ==============================================
key (in shard n)            type     what
==========================  =======  ==============================================
``P:{n}:id``                string   the deployment identity, written once by
                                     ``migrate``; every script checks it, so a wiped
                                     or replaced shard refuses instead of starting
                                     over
``P:{n}:m:T:C``             hash     conversation meta: ``v`` membership version,
                                     ``f`` lowest readable version, ``mc`` member
                                     count, ``s`` last seq, ``a`` first available
                                     seq, ``wc`` the seq retention wants to cut to,
                                     ``ix`` 1 when ``um``/``ur`` are kept
``P:{n}:u:T:C``             zset     every user with membership intervals (score 0,
                                     listed in id order with ZRANGE BYLEX)
``P:{n}:iv:T:C``            hash     user -> version intervals ``s1,u1,s2``
                                     (``service.domain.membership``)
``P:{n}:um:T:C``            zset     the members now (score 0, id order): what a
                                     listing reads, with ``ur``
``P:{n}:ur:T:C``            zset     users who are members no more, score the
                                     version they were last removed at; both are
                                     kept once meta ``ix`` is 1 (conversations
                                     created by this release), else a listing
                                     walks ``u``
``P:{n}:h:T:C``             zset     history: score seq, member ``<seq>:<record>``
``P:{n}:x:T:C``             zset     history expiry: score expiry (ms), member seq
``P:{n}:p:T:C``             zset     seqs of unfinished intents: retention never
                                     trims at or past the lowest
``P:{n}:g:T:C``             zset     seqs an operator abandoned (score and member
                                     the seq): permanent history gaps, dropped
                                     once retention has passed them
``P:{n}:c:T:C:S:K``         hash     one commit: full form until COMMITTED, then the
                                     compact form with logical expiry ``x`` and TTL;
                                     an abandoned one: ``st`` ``A``, ``x``, and ``ab``
                                     the audit record (JSON: by, why, at, seq)
``P:{n}:k:T:S:K``           hash     key pointer (shard of T:S:K): ``c`` the raw
                                     conversation id, ``x`` expiry once committed;
                                     makes a CommitKey unique across conversations
``P:{n}:rq``                zset     recovery queue: score due time, member
                                     ``T:C:S:K``
``P:{n}:rc``                zset     the same members by creation time
``P:{n}:ra``                hash     member -> ``attempts|last problem``
``P:{n}:rz``                zset     quarantined members (score 0, id order)
``P:{n}:ob``                stream   outbox partition n
``P:{n}:wb``                string   a counter written before WAIT, when ACKs wait
                                     for replicas (``MC_REDIS_WAIT_REPLICAS``)
``P:meta``                  hash     ``schema`` 2, ``deployment``, ``shards``,
                                     ``created_ms``
==========================  =======  ==============================================

Layout 1 (release 1) names are kept in ``Release1Keys`` for the upgrade.
"""

from __future__ import annotations

import functools
import re
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

SCHEMA_VERSION = "2"
DEFAULT_SHARDS = 128
MAX_SHARDS = 16384
CACHED_CONVERSATIONS = 4096  # KeySpace.conversation keeps the keys of this many
_PREFIX_RE = re.compile(r"[A-Za-z0-9._\-]{1,64}")
_SAFE = "-._~"  # with A-Z a-z 0-9, the characters kept as they are


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid key prefix, else raise ValueError."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError("prefix must be 1-64 characters from A-Z a-z 0-9 . _ -")
    return prefix


@functools.lru_cache(maxsize=65536)
def enc(value: str) -> str:
    """The collision-free key form of an identifier (percent-encoding).

    Cached: one commit builds its keys from the same few ids some 40 times,
    and quoting was ~5 % of a Redis commit's CPU (issue 27 profile)."""
    return quote(value, safe=_SAFE, encoding="utf-8", errors="strict")


def dec(value: str) -> str:
    """The identifier an ``enc`` produced."""
    return unquote(value, encoding="utf-8", errors="strict")


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one shard that are not per conversation."""

    number: int
    identity: str
    queue: str
    created: str
    attempts: str
    quarantine: str
    outbox: str
    barrier: str


@dataclass(frozen=True, slots=True)
class ConversationKeys:
    """The keys of one conversation (all in its shard)."""

    shard: ShardKeys
    meta: str
    users: str
    intervals: str
    history: str
    expiry: str
    pinned: str
    _commit_base: str
    gaps: str
    current: str
    removed: str

    def commit(self, sender: str, cmid: str) -> str:
        return f"{self._commit_base}:{enc(sender)}:{enc(cmid)}"


@dataclass(frozen=True, slots=True)
class PointerKeys:
    """The key pointer of one CommitKey and its shard's identity key."""

    shard: ShardKeys
    pointer: str


class KeySpace:
    """Builds every key of one deployment (one prefix, a fixed shard count)."""

    def __init__(self, prefix: str, shards: int = DEFAULT_SHARDS) -> None:
        self.prefix = check_prefix(prefix)
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be between 1 and {MAX_SHARDS}")
        self.shards = shards
        self.meta = f"{prefix}:meta"
        self._shards = [self._shard(n) for n in range(shards)]
        self._conversations: dict[tuple[str, str], ConversationKeys] = {}

    def _shard(self, n: int) -> ShardKeys:
        base = f"{self.prefix}:{{{n}}}"
        return ShardKeys(
            n,
            f"{base}:id",
            f"{base}:rq",
            f"{base}:rc",
            f"{base}:ra",
            f"{base}:rz",
            f"{base}:ob",
            f"{base}:wb",
        )

    def all_shards(self) -> list[ShardKeys]:
        return self._shards

    def shard(self, n: int) -> ShardKeys:
        return self._shards[n]

    def shard_of(self, *ids: str) -> ShardKeys:
        joined = ":".join(enc(i) for i in ids)
        return self._shards[zlib.crc32(joined.encode()) % self.shards]

    def conversation(self, tenant: str, conversation: str) -> ConversationKeys:
        """The keys of a conversation, kept for up to ``CACHED_CONVERSATIONS``
        conversations, the oldest made dropped first (a commit asks four times;
        a build quotes and formats ten keys, about 3 us)."""
        cached = self._conversations
        keys = cached.get((tenant, conversation))
        if keys is None:
            keys = self._conversation(tenant, conversation)
            if len(cached) >= CACHED_CONVERSATIONS:
                del cached[next(iter(cached))]  # the oldest
            cached[(tenant, conversation)] = keys
        return keys

    def _conversation(self, tenant: str, conversation: str) -> ConversationKeys:
        shard = self.shard_of(tenant, conversation)
        tc = f"{enc(tenant)}:{enc(conversation)}"
        base = f"{self.prefix}:{{{shard.number}}}"
        return ConversationKeys(
            shard,
            f"{base}:m:{tc}",
            f"{base}:u:{tc}",
            f"{base}:iv:{tc}",
            f"{base}:h:{tc}",
            f"{base}:x:{tc}",
            f"{base}:p:{tc}",
            f"{base}:c:{tc}",
            f"{base}:g:{tc}",
            f"{base}:um:{tc}",
            f"{base}:ur:{tc}",
        )

    def pointer(self, tenant: str, sender: str, cmid: str) -> PointerKeys:
        shard = self.shard_of(tenant, sender, cmid)
        ids = f"{enc(tenant)}:{enc(sender)}:{enc(cmid)}"
        return PointerKeys(shard, f"{self.prefix}:{{{shard.number}}}:k:{ids}")

    @staticmethod
    def queue_member(tenant: str, conversation: str, sender: str, cmid: str) -> str:
        return ":".join(enc(part) for part in (tenant, conversation, sender, cmid))

    @staticmethod
    def parse_queue_member(member: str) -> tuple[str, str, str, str]:
        """(tenant, conversation, sender, cmid); ValueError when malformed."""
        parts = member.split(":")
        if len(parts) != 4:
            raise ValueError("malformed recovery entry")
        tenant, conversation, sender, cmid = (dec(p) for p in parts)
        return tenant, conversation, sender, cmid

    def patterns(self) -> tuple[str, ...]:
        """SCAN MATCH patterns covering every key of this prefix."""
        return (f"{self.prefix}:*",)


class Release1Keys:
    """Layout 1 names (release 1), read only by the upgrade in ``deployment``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.schema = f"{prefix}:schema"
        self.recovery = f"{prefix}:recovery"
        self.outbox = f"{prefix}:outbox"
        self.meta_pattern = f"{prefix}:{{*:*}}:m"

    def conversation_base(self, meta_key: str) -> str:
        return meta_key[: -len(":m")]

    def pointer(self, tenant: str, sender: str, cmid: str) -> str:
        return f"{self.prefix}:k:{enc(tenant)}:{enc(sender)}:{enc(cmid)}"

    def parse_base(self, base: str) -> tuple[str, str]:
        """(tenant, conversation) of a layout-1 ``P:{T:C}`` base."""
        tag = base[len(self.prefix) + 2 : -1]
        tenant, sep, conversation = tag.partition(":")
        if not sep or not base.endswith("}"):
            raise ValueError("not a layout-1 conversation key")
        return dec(tenant), dec(conversation)
