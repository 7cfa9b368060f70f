"""Rows answers of the direct path decoded with metadata parsed once per statement.

On protocol v4 a Cassandra node sends every ``ROWS`` answer with its result
metadata (``direct.py`` asks for rows without it only where Scylla's
metadata id makes that safe), and the driver parses it again for every
answer: each column's keyspace, table and name, and its type, for which
``read_type`` builds a parameterised type class per collection column. In the
issue 26 profile of a fresh commit that was most of a read's CPU; a fresh
commit reads two rows and gets four conditional answers, all with metadata.

``ResultCache`` keeps, per prepared statement, the raw metadata bytes of the
answers it has seen (at most ``LIMIT`` shapes: a conditional write answers
``[applied]`` alone, or with the current row) next to what the driver parsed
from them. An answer whose metadata is byte for byte one of those is handed to
the driver's decoder as if the node had skipped the metadata (the protocol's
``NO_METADATA`` form), with the parsed metadata as the statement's
``result_metadata``: the same path the driver takes for a SKIP_METADATA
answer. Nothing is trusted that the answer did not say: a schema change that
alters the metadata alters its bytes, and the answer is parsed in full again.
Answers with paging state, a metadata id, continuous paging, or frame flags
(warnings, tracing, a custom payload) always take the driver's full path.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

RESULT = 0x08
LIMIT = 4
"""Metadata shapes kept per statement."""

_ROWS = b"\x00\x00\x00\x02"
_GLOBAL_TABLES_SPEC = 0x0001
_NOT_CACHED = 0x0002 | 0x0004 | 0x0008 | 0x40000000 | 0x80000000
"""More pages, no metadata, a metadata id, continuous paging (and its last page)."""
_NO_METADATA = 0x0004
_int2 = struct.Struct(">ii")
_head = struct.Struct(">iii")
_int = struct.Struct(">i").unpack_from
_short = struct.Struct(">H").unpack_from
_CUSTOM, _LIST, _MAP, _SET, _UDT, _TUPLE = 0x0000, 0x0020, 0x0021, 0x0022, 0x0030, 0x0031

Decode = Callable[..., Any]


class ResultCache:
    """One prepared statement's answers (see the module docs)."""

    __slots__ = ("_decode", "_known", "hits")

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._known: list[tuple[bytes, list[Any]]] = []
        self.hits = 0
        """Answers decoded with cached metadata."""

    def decode(
        self,
        protocol_version: int,
        features: Any,
        user_type_map: Any,
        stream_id: int,
        flags: int,
        opcode: int,
        body: bytes,
        decompressor: Any,
        result_metadata: Any,
    ) -> Any:
        """``ProtocolHandler.decode_message``'s signature (``Connection.send_msg``'s decoder)."""
        if opcode != RESULT or flags or type(body) is not bytes or not body.startswith(_ROWS):
            return self._decode(
                protocol_version,
                features,
                user_type_map,
                stream_id,
                flags,
                opcode,
                body,
                decompressor,
                result_metadata,
            )
        for raw, columns in self._known:
            if body.startswith(raw, 4):
                self.hits += 1
                short = _head.pack(2, _NO_METADATA, len(columns)) + body[4 + len(raw) :]
                return self._decode(
                    protocol_version,
                    features,
                    user_type_map,
                    stream_id,
                    0,
                    opcode,
                    short,
                    decompressor,
                    columns,
                )
        message = self._decode(
            protocol_version,
            features,
            user_type_map,
            stream_id,
            0,
            opcode,
            body,
            decompressor,
            result_metadata,
        )
        parsed = getattr(message, "column_metadata", None)
        if parsed and len(self._known) < LIMIT:
            end = metadata_end(body, 4)
            if end is not None:
                self._known.append((body[4:end], parsed))
        return message


def metadata_end(body: bytes, at: int) -> int | None:
    """Where the ``<metadata>`` of a ROWS answer starting at ``at`` ends, or None
    when it is not one to cache (paging state, metadata id, no metadata) or does
    not parse."""
    try:
        flags, count = _int2.unpack_from(body, at)
        if flags & _NOT_CACHED or count <= 0:
            return None
        at += 8
        if flags & _GLOBAL_TABLES_SPEC:
            at = _string(body, _string(body, at))
        for _ in range(count):
            if not flags & _GLOBAL_TABLES_SPEC:
                at = _string(body, _string(body, at))
            at = _option(body, _string(body, at))
        if at + 4 > len(body):
            return None
        return at
    except (struct.error, IndexError):
        return None


def _string(body: bytes, at: int) -> int:
    size: int = _short(body, at)[0]
    end = at + 2 + size
    if end > len(body):
        raise IndexError("a string past the end")
    return end


def _option(body: bytes, at: int) -> int:
    code: int = _short(body, at)[0]
    at += 2
    if code == _CUSTOM:
        return _string(body, at)
    if code in (_LIST, _SET):
        return _option(body, at)
    if code == _MAP:
        return _option(body, _option(body, at))
    if code == _UDT:
        at = _string(body, _string(body, at))
        fields: int = _short(body, at)[0]
        at += 2
        for _ in range(fields):
            at = _option(body, _string(body, at))
        return at
    if code == _TUPLE:
        items: int = _short(body, at)[0]
        at += 2
        for _ in range(items):
            at = _option(body, at)
        return at
    return at
