"""EXECUTE and BATCH frames of the direct path, encoded by hand.

The driver encodes a request by building an ``ExecuteMessage`` (or
``BatchMessage``) and writing it field by field into a ``BytesIO``: about a
dozen calls per request, a quarter of ``DirectSender.send`` in the issue 26
profile of a fresh commit (docs/scylla.md, "What the 10 requests cost"). Here
a request is a ``Frame`` (the same fields, no behaviour) and ``encode`` packs it
with a few ``struct`` calls and one ``join``.

The layout is native protocol v4 (``direct.PROTOCOL_VERSION``) with the two
Scylla extensions the driver negotiates: the result-metadata id after the
statement id (``use_metadata_id``) and the trailing tablet-version byte
(``tablets_routing_v2``). A compressor or the beta flag go through the driver's
own ``encode_message`` (which calls ``Frame.send_body``). ``send_path.check_frames``
compares every prepared statement's frames with the driver's own, byte for byte,
for each feature set in use, before the direct path sends anything with them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from cassandra.protocol import ProtocolHandler
from cassandra.query import UNSET_VALUE

EXECUTE = 0x0A
BATCH = 0x0D
_VERSION = 4
_VALUES = 0x01
_SKIP_METADATA = 0x02
_PAGE_SIZE = 0x04
_SERIAL = 0x10
_TIMESTAMP = 0x20
_UNLOGGED = 1

_header = struct.Struct(">BBhBi").pack
_short = struct.Struct(">H").pack
_int = struct.Struct(">i").pack
_long = struct.Struct(">q").pack
_cl_flags_count = struct.Struct(">HBH").pack
_cl_flags = struct.Struct(">HB").pack
_batch_head = struct.Struct(">BH").pack
_query_head = struct.Struct(">BH").pack
_NULL = _int(-1)
_UNSET = _int(-2)

Values = Sequence[object]
"""Serialised values: bytes, None (null) or ``UNSET_VALUE``."""


class Frame:
    """One request's fields, as the driver's message would hold them."""

    __slots__ = (
        "consistency_level",
        "fetch_size",
        "opcode",
        "queries",
        "result_metadata_id",
        "serial_consistency_level",
        "skip_meta",
        "tablet_version_block",
        "timestamp",
    )
    custom_payload = None
    tracing = False

    def __init__(
        self,
        opcode: int,
        queries: Sequence[tuple[bytes, Values]],
        consistency_level: int,
        serial_consistency_level: int | None,
        timestamp: int | None,
        *,
        fetch_size: int | None = None,
        skip_meta: bool = False,
        result_metadata_id: bytes | None = None,
    ) -> None:
        self.opcode = opcode
        self.queries = queries
        """``(statement id, serialised values)``: one for EXECUTE, any number for BATCH."""
        self.consistency_level = consistency_level
        self.serial_consistency_level = serial_consistency_level
        self.timestamp = timestamp
        self.fetch_size = fetch_size
        self.skip_meta = skip_meta
        self.result_metadata_id = result_metadata_id
        self.tablet_version_block = 0  # no tablets: the backend refuses such keyspaces

    def body(self, features: Any) -> bytes:
        execute = self.opcode == EXECUTE
        metadata_id = execute and features is not None and bool(features.use_metadata_id)
        serial = self.serial_consistency_level
        timestamp = self.timestamp
        flags = 0
        if serial:
            flags |= _SERIAL
        if timestamp is not None:
            flags |= _TIMESTAMP
        if execute:
            ((query_id, values),) = self.queries
            flags |= _VALUES
            if self.fetch_size:
                flags |= _PAGE_SIZE
            if self.skip_meta and metadata_id:
                flags |= _SKIP_METADATA
            parts = [_short(len(query_id)), query_id]
            if metadata_id:
                mid = self.result_metadata_id or b""
                parts += (_short(len(mid)), mid)
            parts += (_cl_flags_count(self.consistency_level, flags, len(values)), *_values(values))
            if self.fetch_size:
                parts.append(_int(self.fetch_size))
        else:
            parts = [_batch_head(_UNLOGGED, len(self.queries))]
            for query_id, values in self.queries:
                parts += (_query_head(1, len(query_id)), query_id, _short(len(values)))
                parts += _values(values)
            parts.append(_cl_flags(self.consistency_level, flags))
        if serial:
            parts.append(_short(serial))
        if timestamp is not None:
            parts.append(_long(timestamp))
        if execute and features is not None and features.tablets_routing_v2:
            parts.append(bytes((self.tablet_version_block or 0,)))
        return b"".join(parts)

    def send_body(self, f: Any, protocol_version: int, protocol_features: Any = None) -> None:
        """The driver's message interface (``ProtocolHandler.encode_message``)."""
        f.write(self.body(protocol_features))


def _values(values: Values) -> list[bytes]:
    return [
        _NULL if value is None else _UNSET if value is UNSET_VALUE else _int(len(value)) + value  # type: ignore[arg-type,operator]
        for value in values
    ]


def encode(
    msg: Any,
    stream_id: int,
    protocol_version: int,
    compressor: Any = None,
    allow_beta_protocol_version: bool = False,
    protocol_features: Any = None,
) -> bytes:
    """``Connection.send_msg``'s encoder: a ``Frame`` packed here, anything else
    (and a compressor, the beta flag, another protocol version) by the driver."""
    if (
        type(msg) is not Frame
        or compressor is not None
        or allow_beta_protocol_version
        or protocol_version != _VERSION
    ):
        return bytes(
            ProtocolHandler.encode_message(
                msg,
                stream_id,
                protocol_version,
                compressor,
                allow_beta_protocol_version,
                protocol_features,
            )
        )
    body = msg.body(protocol_features)
    return _header(_VERSION, 0, stream_id, msg.opcode, len(body)) + body
