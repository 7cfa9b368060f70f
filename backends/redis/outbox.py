"""RedisOutbox: the outbox as one Redis Stream (``<prefix>:outbox``).

``publish`` is one XADD; its reply (the entry id) is the durable position,
and ``OutboxPublication(stream=<stream key>, position=<entry id>)`` is what
the commit records. Delivery is at least once: a crash or a lost reply
after XADD makes the committer publish again, so the stream may hold the
same message twice (only one of the two positions is recorded). Consumers
dedupe by message id. ``read`` is XRANGE from an exclusive position.

Entry fields: ``t`` tenant, ``c`` conversation, ``s`` seq, ``m`` message id,
``r`` recipients (JSON list), ``v`` membership version. No body: consumers
read the record from history when they need it.

The stream is never trimmed by the service; trim it (XTRIM MINID) once
every consumer group is past an id.
"""

from __future__ import annotations

import json
import re
from typing import Any

from backends.redis import codec
from backends.redis.keys import KeySpace
from backends.redis.link import RedisLink
from service.domain.errors import StoreCorrupt, StoreInvalid
from service.domain.model import CommitIntent, OutboxEntry, OutboxPublication
from service.domain.ports import Outbox

_POSITION_RE = re.compile(r"\d{1,20}-\d{1,20}")


class RedisOutbox(Outbox):
    """XADD to publish, XRANGE to read."""

    def __init__(self, link: RedisLink, keys: KeySpace) -> None:
        self._link = link
        self._stream = keys.outbox

    async def publish(self, intent: CommitIntent) -> OutboxPublication:
        r = intent.record
        position = await self._link.call(
            "XADD",
            self._stream,
            "*",
            "t",
            r.tenant,
            "c",
            r.conversation,
            "s",
            r.seq,
            "m",
            r.message_id,
            "r",
            json.dumps(list(intent.delivery.recipients), separators=(",", ":")),
            "v",
            intent.delivery.membership_version,
            write=True,
        )
        return OutboxPublication(self._stream, codec.to_str(position))

    async def read(self, after: str, limit: int) -> list[OutboxEntry]:
        if limit <= 0:
            return []
        if after and not _POSITION_RE.fullmatch(after):
            raise StoreInvalid("outbox position is malformed")
        start = f"({after}" if after else "-"
        entries = await self._link.call(
            "XRANGE", self._stream, start, "+", "COUNT", limit, write=False
        )
        if not isinstance(entries, list):
            raise StoreCorrupt("redis gave an unexpected reply")
        return [self._entry(entry) for entry in entries]

    def _entry(self, entry: Any) -> OutboxEntry:
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise StoreCorrupt("an outbox entry is malformed")
        position, raw = entry
        fields = codec.pairs(list(raw)) if isinstance(raw, list | tuple) else _as_dict(raw)
        try:
            recipients = json.loads(fields.get(b"r", b"[]"))
        except ValueError as exc:
            raise StoreCorrupt("an outbox entry could not be decoded") from exc
        if not isinstance(recipients, list) or not all(isinstance(x, str) for x in recipients):
            raise StoreCorrupt("an outbox entry is malformed")
        return OutboxEntry(
            publication=OutboxPublication(self._stream, codec.to_str(position)),
            tenant=codec.to_str(fields.get(b"t")),
            conversation=codec.to_str(fields.get(b"c")),
            seq=codec.to_int(fields.get(b"s")),
            message_id=codec.to_str(fields.get(b"m")),
            recipients=tuple(recipients),
        )

    async def readiness(self) -> None:
        await self._link.call("PING", write=False)


def _as_dict(raw: Any) -> dict[bytes, bytes]:
    if not isinstance(raw, dict):
        raise StoreCorrupt("an outbox entry is malformed")
    return {k: v for k, v in raw.items() if isinstance(k, bytes) and isinstance(v, bytes)}
