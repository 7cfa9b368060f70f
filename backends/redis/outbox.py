"""RedisOutbox: one Redis Stream per shard (``P:{n}:ob``), the conversation's shard.

``publish`` is one XADD to the stream of the conversation's shard, so all
entries of one conversation are in one partition, in commit order, and a
Cluster spreads the partitions over its nodes. The reply (the entry id) is
the durable position: ``OutboxPublication(stream=<stream key>, position=<id>)``.
Delivery is at least once: a crash or a lost reply after XADD makes the
committer publish again, so a stream may hold the same message twice (only
one position is recorded). Consumers dedupe by message id.

Entry fields: ``t`` tenant, ``c`` conversation, ``s`` seq, ``m`` message id,
``v`` membership version (the recipients are that version's members).
Release 1 wrote ``r``, the recipients inline, to one stream ``P:outbox``; it
is read as the first partition ("legacy") for as long as it exists.

``read`` (tests and tools) walks the partitions in order with a token
``<partition>|<entry id>``; the relay consumes them with consumer groups
(``backends.redis.partitions``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from backends.redis import codec
from backends.redis.keys import KeySpace, Release1Keys
from backends.redis.link import RedisLink
from service.domain.errors import StoreCorrupt, StoreInvalid
from service.domain.model import CommitIntent, OutboxEntry, OutboxPage, OutboxPublication
from service.domain.ports import Hook, Outbox

_POSITION_RE = re.compile(r"\d{1,20}-\d{1,20}")


def _parse_token(after: str, partitions: int) -> tuple[int, str]:
    """(partition index, position) of a ``read`` token; "" starts at the beginning."""
    if not after:
        return 0, ""
    number, sep, position = after.partition("|")
    if not sep or not number.isdigit() or int(number) > partitions:
        raise StoreInvalid("outbox position is not one this outbox returned")
    if position and not _POSITION_RE.fullmatch(position):
        raise StoreInvalid("outbox position is malformed")
    return int(number), position


class RedisOutbox(Outbox):
    """XADD to publish, XRANGE to read."""

    def __init__(self, link: RedisLink, keys: KeySpace) -> None:
        self.link = link
        self._link = link
        self._keys = keys
        self._legacy = Release1Keys(keys.prefix).outbox

    def stream_of(self, tenant: str, conversation: str) -> str:
        return self._keys.conversation(tenant, conversation).shard.outbox

    def partitions(self) -> list[str]:
        """Every stream, legacy first: what a relay must drain."""
        return [self._legacy, *(s.outbox for s in self._keys.all_shards())]

    @staticmethod
    def entry_fields(intent: CommitIntent) -> list[str | int]:
        """The stream entry's fields of ``intent`` (also appended by the store's
        pipelined commit, ``outbox_append``)."""
        r, d = intent.record, intent.delivery
        fields: list[str | int] = ["t", r.tenant, "c", r.conversation, "s", r.seq,
                                   "m", r.message_id, "v", d.membership_version]  # fmt: skip
        if d.recipients is not None:  # an intent of release 1, frozen inline
            fields += ["r", json.dumps(list(d.recipients), separators=(",", ":"))]
        return fields

    async def publish(self, intent: CommitIntent, sent: Hook | None = None) -> OutboxPublication:
        r = intent.record
        stream = self.stream_of(r.tenant, r.conversation)
        fields = self.entry_fields(intent)
        position = await self._link.call("XADD", stream, "*", *fields, write=True)
        if sent is not None:
            sent()
        return OutboxPublication(stream, codec.to_str(position))

    async def read(self, after: str, limit: int) -> OutboxPage:
        streams = self.partitions()
        index, position = _parse_token(after, len(streams))
        found: list[OutboxEntry] = []
        while index < len(streams) and len(found) < limit:
            want = limit - len(found)
            start = f"({position}" if position else "-"
            entries = await self._link.call(
                "XRANGE", streams[index], start, "+", "COUNT", want, write=False
            )
            if not isinstance(entries, list):
                raise StoreCorrupt("redis gave an unexpected reply")
            found += [decode_entry(streams[index], e) for e in entries]
            if entries:
                position = found[-1].publication.position
            if len(entries) < want:  # this partition is drained: on to the next
                index, position = index + 1, ""
        return OutboxPage(tuple(found), f"{index}|{position}")

    async def readiness(self) -> None:
        await self._link.call("PING", write=False)


def decode_entry(stream: str, entry: Any) -> OutboxEntry:
    """One stream entry (``[id, fields]``) as an OutboxEntry; its publication time
    is the entry id's milliseconds (Redis's own clock)."""
    if not isinstance(entry, list | tuple) or len(entry) != 2:
        raise StoreCorrupt("an outbox entry is malformed")
    position, raw = entry
    fields = codec.pairs(list(raw)) if isinstance(raw, list | tuple) else _as_dict(raw)
    recipients: tuple[str, ...] | None = None
    if b"r" in fields:
        try:
            inline = json.loads(fields[b"r"])
        except ValueError as exc:
            raise StoreCorrupt("an outbox entry could not be decoded") from exc
        if not isinstance(inline, list) or not all(isinstance(x, str) for x in inline):
            raise StoreCorrupt("an outbox entry is malformed")
        recipients = tuple(inline)
    text = codec.to_str(position)
    if not _POSITION_RE.fullmatch(text):
        raise StoreCorrupt("an outbox entry id is malformed")
    return OutboxEntry(
        publication=OutboxPublication(stream, text),
        tenant=codec.to_str(fields.get(b"t")),
        conversation=codec.to_str(fields.get(b"c")),
        seq=codec.to_int(fields.get(b"s")),
        message_id=codec.to_str(fields.get(b"m")),
        recipients=recipients,
        membership_version=codec.to_int(fields.get(b"v", b"0")),
        published_ms=int(text.partition("-")[0]),
    )


def _as_dict(raw: Any) -> dict[bytes, bytes]:
    if not isinstance(raw, dict):
        raise StoreCorrupt("an outbox entry is malformed")
    return {k: v for k, v in raw.items() if isinstance(k, bytes) and isinstance(v, bytes)}
