"""Canonical request identity: which sends are "the same send".

Two sends are the same when every one of these is equal: tenant, sender,
device, conversation, cmid, content (message type, custom type, inline body,
body reference) and mentions (in order) and reply-to. The encoding below is
deterministic and language-neutral so another implementation can reproduce
it byte for byte (``tests/unit/test_identity.py`` holds test vectors).

Whole form (legacy, header ``QIMC``)::

    "QIMC" 0x01                      magic and encoding version
    field*                           in this order, each exactly once:
      tag:u8 length:u32be bytes      strings are UTF-8

    tag 0x01 tenant      0x02 sender         0x03 device      0x04 conversation
    tag 0x05 cmid        0x06 message_type   0x07 custom_type 0x08 inline body
    tag 0x09 body_ref    value = presence:u8 (0 or 1), then when 1:
                         uri_len:u32be uri size:u64be sha_len:u32be sha256-hex
    tag 0x0A mentions    value = count:u32be, then per mention len:u32be bytes
    tag 0x0B reply_to

Digest form (current, header ``QIMD``)::

    "QIMD" 0x01 SHA-256("message-committer/identity/v1" 0x00 || whole form)

The digest is domain-separated so it can never equal a digest computed for
another purpose over the same bytes. Readers accept both forms: a stored
digest is compared with the request's digest, a stored whole form with the
request's whole form, byte for byte.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.domain.model import AuthenticatedSend

WHOLE_HEADER = b"QIMC\x01"
DIGEST_HEADER = b"QIMD\x01"
DIGEST_DOMAIN = b"message-committer/identity/v1\x00"
DIGEST_LENGTH = len(DIGEST_HEADER) + 32


def _field(tag: int, value: bytes) -> bytes:
    return struct.pack(">BI", tag, len(value)) + value


def _text(value: str) -> bytes:
    return value.encode("utf-8")


def canonical_identity(send: AuthenticatedSend) -> bytes:
    """The whole canonical identity of ``send`` (header ``QIMC``)."""
    content = send.content
    ref = content.body_ref
    if ref is None:
        ref_value = b"\x00"
    else:
        uri, sha = _text(ref.uri), _text(ref.sha256)
        ref_value = (
            b"\x01"
            + struct.pack(">I", len(uri))
            + uri
            + struct.pack(">Q", ref.size_bytes)
            + struct.pack(">I", len(sha))
            + sha
        )
    mentions = struct.pack(">I", len(send.mentions)) + b"".join(
        struct.pack(">I", len(m)) + m for m in map(_text, send.mentions)
    )
    return WHOLE_HEADER + b"".join(
        (
            _field(0x01, _text(send.tenant)),
            _field(0x02, _text(send.sender)),
            _field(0x03, _text(send.device)),
            _field(0x04, _text(send.conversation)),
            _field(0x05, _text(send.cmid)),
            _field(0x06, _text(content.message_type.value)),
            _field(0x07, _text(content.custom_type)),
            _field(0x08, content.body),
            _field(0x09, ref_value),
            _field(0x0A, mentions),
            _field(0x0B, _text(send.reply_to)),
        )
    )


def digest_of_whole(whole: bytes) -> bytes:
    """The ``QIMD`` digest form of a whole identity."""
    return DIGEST_HEADER + hashlib.sha256(DIGEST_DOMAIN + whole).digest()


def reserve_identity_digest(send: AuthenticatedSend) -> bytes:
    """The identity a reserve stores today (header ``QIMD``, 37 bytes)."""
    return digest_of_whole(canonical_identity(send))


def matches(send: AuthenticatedSend, stored: bytes) -> bool:
    """True when ``stored`` (digest or whole form) identifies ``send``.

    Unknown headers never match: a record we cannot interpret is not ours to
    replay.
    """
    if stored.startswith(DIGEST_HEADER):
        return hmac.compare_digest(stored, reserve_identity_digest(send))
    if stored.startswith(WHOLE_HEADER):
        return stored == canonical_identity(send)
    return False


def as_digest(stored: bytes) -> bytes:
    """Any stored identity in its digest form (compaction keeps only this)."""
    if stored.startswith(WHOLE_HEADER):
        return digest_of_whole(stored)
    return stored
