"""Byte forms of what the Redis backend stores, and their decoders.

Record (in a commit hash's ``r`` field and, prefixed with ``<seq>:``, as a
history member): compact JSON, keys in a fixed order, empty values left
out, so encoding a decoded record gives the same bytes again (the scripts
compare records byte for byte). Tenant, conversation and seq are not in
it: the key and the score carry them.

========  ===========================  ========  ===========================
json key  field                        json key  field
========  ===========================  ========  ===========================
``i``     message id                   ``b``     inline body, base64
``u``     sender                       ``f``     body reference [uri, size, sha256]
``d``     device                       ``n``     mentions (list)
``k``     cmid                         ``p``     reply-to
``y``     message type                 ``t``     server timestamp (ms)
``c``     custom type
========  ===========================  ========  ===========================

A mailbox entry's record (``encode_lane_record``) adds ``mv``: the membership
version its delivery was frozen at; entries written before it read as 0.

Commit hash, full form (RESERVED, RECORDED, OUTBOXED)::

    st  state rank: 0 reserved, 1 recorded, 2 outboxed
    id  identity (QIMD digest, or the legacy QIMC whole form)
    r   record json            s  seq      m  message id     t  server ts
    d   delivery json {"v": membership version}; release 1 wrote the recipients
        inline as well, {"r": [ids], "v": version}, and both are read
    ca  created_at (ms, the server's TIME)
    ps / pp  publication stream / position, once known

Compact form (COMMITTED, rank 3): ``st id m s t ps pp x`` where ``id`` is
always the digest and ``x`` the logical expiry (ms). Every value stays
under 64 bytes for ids of usual length, so the hash keeps the ``listpack``
encoding.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from service.domain.errors import StoreCorrupt
from service.domain.ids import CommitKey
from service.domain.model import (
    BodyReference,
    CommitIntent,
    CommitState,
    CommittedMessage,
    FrozenDeliveryInput,
    MessageContent,
    MessageRecord,
    MessageType,
    OutboxPublication,
)

STATE_CODES: dict[CommitState, bytes] = {s: str(s.rank).encode() for s in CommitState}
_STATES_BY_CODE = {code: state for state, code in STATE_CODES.items()}


MAX_JSON_DEPTH = 8
"""Nesting a stored document may have; a record needs 2. Deeper bytes are corrupt
(``json`` would recurse on them until ``RecursionError``)."""


def _loads(blob: bytes) -> Any:
    """``json.loads`` with bounded nesting: StoreCorrupt (never RecursionError)
    on a document nested deeper than MAX_JSON_DEPTH."""
    if blob.count(b"[") + blob.count(b"{") > MAX_JSON_DEPTH and _depth(blob) > MAX_JSON_DEPTH:
        raise StoreCorrupt("a stored document is nested too deeply")
    try:
        return json.loads(blob)
    except RecursionError as exc:  # the bound above makes this unreachable; kept as a net
        raise StoreCorrupt("a stored document is nested too deeply") from exc


def _depth(blob: bytes) -> int:
    """The deepest bracket nesting outside string literals (stops past the bound)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in blob:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                break
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)  # made once, not per call


def _dumps(value: object) -> bytes:
    return _JSON.encode(value).encode("ascii")


def encode_record(record: MessageRecord) -> bytes:
    """The record without tenant, conversation and seq (see the module doc)."""
    return _dumps(_record_doc(record))


def encode_lane_record(record: MessageRecord, membership_version: int) -> bytes:
    """A mailbox entry's record: ``encode_record``'s form plus ``mv``, the
    membership version its delivery was frozen at (left out when unknown, 0).
    A key of its own in the same object, so a reader that does not know it
    (``decode_record``) still reads the record."""
    doc = _record_doc(record)
    if membership_version:
        doc["mv"] = membership_version
    return _dumps(doc)


def _record_doc(record: MessageRecord) -> dict[str, object]:
    c = record.content
    doc: dict[str, object] = {
        "i": record.message_id,
        "u": record.sender,
        "d": record.device,
        "k": record.cmid,
        "y": c.message_type.value,
    }
    if c.custom_type:
        doc["c"] = c.custom_type
    if c.body:
        doc["b"] = base64.b64encode(c.body).decode("ascii")
    if c.body_ref is not None:
        doc["f"] = [c.body_ref.uri, c.body_ref.size_bytes, c.body_ref.sha256]
    if record.mentions:
        doc["n"] = list(record.mentions)
    if record.reply_to:
        doc["p"] = record.reply_to
    doc["t"] = record.server_ts_ms
    return doc


def history_member(record: MessageRecord, reading_version: int = 0) -> bytes:
    """A history member, ``seq:record``: the record as ``encode_lane_record`` writes
    it, with ``mv``, the membership version its commit froze, when known (the
    put_record script inserts it the same way; ``bare_member`` there drops it)."""
    return b"%d:" % record.seq + encode_lane_record(record, reading_version)


def _str(doc: dict[str, Any], name: str, default: str | None = None) -> str:
    value = doc.get(name, default)
    if not isinstance(value, str):
        raise StoreCorrupt("a stored record has a malformed field")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreCorrupt("a stored record has a malformed number")
    return value


def decode_record(tenant: str, conversation: str, seq: int, blob: bytes) -> MessageRecord:
    return decode_lane_record(tenant, conversation, seq, blob)[0]


def decode_lane_record(
    tenant: str, conversation: str, seq: int, blob: bytes
) -> tuple[MessageRecord, int]:
    """``encode_lane_record``'s record and membership version (0 when absent)."""
    try:
        doc = _loads(blob)
        if not isinstance(doc, dict):
            raise StoreCorrupt("a stored record is not an object")
        return _record_of(tenant, conversation, seq, doc), _int(doc.get("mv", 0))
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise StoreCorrupt("a stored record could not be decoded") from exc


def _record_of(tenant: str, conversation: str, seq: int, doc: dict[str, Any]) -> MessageRecord:
    ref_doc = doc.get("f")
    ref = None
    if ref_doc is not None:
        if not isinstance(ref_doc, list) or len(ref_doc) != 3:
            raise StoreCorrupt("a stored body reference is malformed")
        uri, size, sha = ref_doc
        if not isinstance(uri, str) or not isinstance(sha, str):
            raise StoreCorrupt("a stored body reference is malformed")
        ref = BodyReference(uri, _int(size), sha)
    mentions = doc.get("n", [])
    if not isinstance(mentions, list) or not all(isinstance(m, str) for m in mentions):
        raise StoreCorrupt("stored mentions are malformed")
    content = MessageContent(
        message_type=MessageType(_str(doc, "y")),
        body=base64.b64decode(_str(doc, "b", ""), validate=True),
        body_ref=ref,
        custom_type=_str(doc, "c", ""),
    )
    return MessageRecord(
        tenant=tenant,
        conversation=conversation,
        seq=seq,
        message_id=_str(doc, "i"),
        sender=_str(doc, "u"),
        device=_str(doc, "d"),
        cmid=_str(doc, "k"),
        content=content,
        mentions=tuple(mentions),
        reply_to=_str(doc, "p", ""),
        server_ts_ms=_int(doc.get("t")),
    )


def decode_history_member(tenant: str, conversation: str, member: bytes) -> MessageRecord:
    return decode_history_candidate(tenant, conversation, member)[0]


def decode_history_candidate(
    tenant: str, conversation: str, member: bytes
) -> tuple[MessageRecord, int]:
    """A history member's record and the membership version its commit froze
    (0, unknown, for a member written before members carried it)."""
    seq, sep, blob = member.partition(b":")
    if not sep:
        raise StoreCorrupt("a history entry is malformed")
    return decode_lane_record(tenant, conversation, to_int(seq), blob)


def encode_delivery(delivery: FrozenDeliveryInput) -> bytes:
    """``{"v": version}`` by reference; release 1's inline form adds ``"r": [ids]``."""
    if delivery.recipients is None:
        return _dumps({"v": delivery.membership_version})
    return _dumps({"r": list(delivery.recipients), "v": delivery.membership_version})


def decode_delivery(blob: bytes) -> FrozenDeliveryInput:
    try:
        doc = _loads(blob)
    except ValueError as exc:
        raise StoreCorrupt("a stored delivery could not be decoded") from exc
    if not isinstance(doc, dict):
        raise StoreCorrupt("a stored delivery is malformed")
    recipients = doc.get("r")
    if recipients is None:
        return FrozenDeliveryInput(None, _int(doc.get("v")))
    if not isinstance(recipients, list) or not all(isinstance(r, str) for r in recipients):
        raise StoreCorrupt("stored recipients are malformed")
    return FrozenDeliveryInput(tuple(recipients), _int(doc.get("v")))


def to_int(raw: object) -> int:
    try:
        if isinstance(raw, bytes):
            return int(raw.decode("ascii"))
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreCorrupt("a stored number could not be decoded") from exc
    raise StoreCorrupt("a stored number is missing or malformed")


def to_str(raw: object) -> str:
    if not isinstance(raw, bytes):
        raise StoreCorrupt("a stored text field is missing")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreCorrupt("a stored text field could not be decoded") from exc


def pairs(flat: list[Any]) -> dict[bytes, bytes]:
    """A flat [field, value, ...] script reply as a dict."""
    if len(flat) % 2 or not all(isinstance(v, bytes) for v in flat):
        raise StoreCorrupt("a stored hash could not be decoded")
    return dict(zip(flat[::2], flat[1::2], strict=True))


def hash_reply(reply: Any) -> dict[bytes, bytes]:
    """An HGETALL reply (a dict from the client, a flat list from a script) as a dict."""
    if reply is None:
        return {}
    if isinstance(reply, dict):
        return {bytes(k): bytes(v) for k, v in reply.items()}
    if isinstance(reply, list):
        return pairs(reply)
    raise StoreCorrupt("redis gave an unexpected reply")


def score_pairs(reply: Any) -> list[tuple[bytes, float]]:
    """A ZRANGE ... WITHSCORES reply as (member, score) pairs, whether the client
    gave it flat ([m, s, m, s]) or paired ([[m, s], ...])."""
    if not isinstance(reply, list):
        return []
    if reply and isinstance(reply[0], list | tuple):
        return [(bytes(m), float(sc)) for m, sc in reply]
    return [(bytes(reply[i]), float(reply[i + 1])) for i in range(0, len(reply) - 1, 2)]


def state_of(fields: dict[bytes, bytes]) -> CommitState:
    state = _STATES_BY_CODE.get(fields.get(b"st", b""))
    if state is None:
        raise StoreCorrupt("a stored commit has an unknown state")
    return state


def publication_of(fields: dict[bytes, bytes]) -> OutboxPublication | None:
    stream, position = fields.get(b"ps"), fields.get(b"pp")
    if stream is None and position is None:
        return None
    return OutboxPublication(to_str(stream), to_str(position))


def committed_of(fields: dict[bytes, bytes], conversation: str, cmid: str) -> CommittedMessage:
    return CommittedMessage(
        conversation=conversation,
        cmid=cmid,
        message_id=to_str(fields.get(b"m")),
        seq=to_int(fields.get(b"s")),
        server_ts_ms=to_int(fields.get(b"t")),
    )


def intent_of(fields: dict[bytes, bytes], key: CommitKey, conversation: str) -> CommitIntent:
    """The unfinished intent a full-form commit hash holds."""
    identity, blob, delivery = fields.get(b"id"), fields.get(b"r"), fields.get(b"d")
    if identity is None or blob is None or delivery is None:
        raise StoreCorrupt("a stored intent is incomplete")
    record = decode_record(key.tenant, conversation, to_int(fields.get(b"s")), blob)
    if (record.sender, record.cmid) != (key.sender, key.cmid):
        raise StoreCorrupt("a stored intent belongs to another key")
    return CommitIntent(
        key=key,
        identity=identity,
        record=record,
        delivery=decode_delivery(delivery),
        state=state_of(fields),
        created_at_ms=to_int(fields.get(b"ca")),
        publication=publication_of(fields),
    )
