"""Key layout of the Redis backend.

Every key starts with the configured prefix ``P`` (default ``mc``; 1-64
characters from ``A-Z a-z 0-9 . _ -``, so it never contains ``:``, ``{`` or
``}``). Identifiers are *encoded*, never concatenated raw: every byte of the
UTF-8 form outside ``A-Z a-z 0-9 . _ ~ -`` becomes ``%XX`` (so ``:``, ``%``,
``{`` and ``}`` can never appear in an encoded id). The encoding is
injective and ``:`` is a safe separator, so two different id tuples never
share a key, across tenants or across key kinds. Below ``T`` ``C`` ``S``
``K`` are the encoded tenant, conversation, sender and cmid.

==========================  =======  ==============================================
key                         type     what, owner and lifetime
==========================  =======  ==============================================
``P:{T:C}:m``               hash     conversation meta: ``v`` membership version,
                                     ``s`` last allocated seq, ``a`` first
                                     available seq. Its existence is the
                                     conversation's. Owner: the conversation;
                                     never expires.
``P:{T:C}:u``               set      member user ids. Owner: the conversation.
``P:{T:C}:h``               zset     history: score = seq, member =
                                     ``<seq>:<record json>``. Trimmed as a prefix
                                     when retention passes.
``P:{T:C}:x``               zset     history expiry: score = expiry (ms), member =
                                     seq; registered at COMMITTED.
``P:{T:C}:c:S:K``           hash     the commit of (tenant, sender, cmid): full form
                                     until COMMITTED, then the compact form.
                                     Unfinished: no expiry. Compact: logical
                                     expiry ``x`` plus a physical TTL.
``P:k:T:S:K``               hash     the key pointer: ``c`` raw conversation id,
                                     ``x`` logical expiry once committed. Finds a
                                     commit by (tenant, sender, cmid) alone and makes
                                     the key unique across conversations.
                                     Same lifetime as its commit hash.
``P:recovery``              zset     recovery index: score = created_at (ms),
                                     member = ``T:C:S:K``; an entry lives from
                                     reserve to COMMITTED. Owner: the deployment.
``P:outbox``                stream   the outbox; entry ids are publication
                                     positions. Owner: the deployment.
``P:schema``                string   the layout version (``1``); checked at open.
==========================  =======  ==============================================

Hash tags: everything of one conversation shares the tag ``{T:C}``, so the
scripts that touch only a conversation (put_record, mark_outbox_published,
history, membership) are single-slot. Reserve and the two COMMITTED scripts
also touch the key pointer and the recovery index: see ``docs/redis.md``
("Redis Cluster") for what a Cluster deployment would change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

SCHEMA_VERSION = "1"
_PREFIX_RE = re.compile(r"[A-Za-z0-9._\-]{1,64}")
_SAFE = "-._~"  # with A-Z a-z 0-9, the characters kept as they are


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid key prefix, else raise ValueError."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError("prefix must be 1-64 characters from A-Z a-z 0-9 . _ -")
    return prefix


def enc(value: str) -> str:
    """The collision-free key form of an identifier (percent-encoding)."""
    return quote(value, safe=_SAFE, encoding="utf-8", errors="strict")


def dec(value: str) -> str:
    """The identifier an ``enc`` produced."""
    return unquote(value, encoding="utf-8", errors="strict")


@dataclass(frozen=True, slots=True)
class ConversationKeys:
    """The keys of one conversation (all under one hash tag)."""

    meta: str
    members: str
    history: str
    expiry: str
    base: str

    def commit(self, sender: str, cmid: str) -> str:
        return f"{self.base}:c:{enc(sender)}:{enc(cmid)}"


class KeySpace:
    """Builds every key of one deployment (one prefix)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = check_prefix(prefix)
        self.recovery = f"{prefix}:recovery"
        self.outbox = f"{prefix}:outbox"
        self.schema = f"{prefix}:schema"

    def conversation(self, tenant: str, conversation: str) -> ConversationKeys:
        base = f"{self.prefix}:{{{enc(tenant)}:{enc(conversation)}}}"
        return ConversationKeys(f"{base}:m", f"{base}:u", f"{base}:h", f"{base}:x", base)

    def pointer(self, tenant: str, sender: str, cmid: str) -> str:
        return f"{self.prefix}:k:{enc(tenant)}:{enc(sender)}:{enc(cmid)}"

    @staticmethod
    def recovery_member(tenant: str, conversation: str, sender: str, cmid: str) -> str:
        return ":".join(enc(part) for part in (tenant, conversation, sender, cmid))

    @staticmethod
    def parse_recovery_member(member: str) -> tuple[str, str, str, str]:
        """(tenant, conversation, sender, cmid); ValueError when malformed."""
        parts = member.split(":")
        if len(parts) != 4:
            raise ValueError("malformed recovery entry")
        tenant, conversation, sender, cmid = (dec(p) for p in parts)
        return tenant, conversation, sender, cmid

    def patterns(self) -> tuple[str, ...]:
        """SCAN MATCH patterns covering every key of this prefix."""
        return (f"{self.prefix}:*",)
