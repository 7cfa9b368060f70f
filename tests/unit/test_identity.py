"""Canonical identity: documented test vectors another implementation can check."""

from __future__ import annotations

import dataclasses
import hashlib

from service.domain import identity
from service.domain.model import AuthenticatedSend, BodyReference, MessageContent, MessageType

TEXT_SEND = AuthenticatedSend(
    "acme",
    "alice",
    "phone-1",
    "general",
    "01HZX3",
    MessageContent(MessageType.TEXT, b"hi"),
    ("bob",),
    "",
)
REF_SEND = AuthenticatedSend(
    "acme",
    "alice",
    "phone-1",
    "general",
    "01HZX4",
    MessageContent(MessageType.IMAGE, body_ref=BodyReference("s3://b/k", 42, "ab" * 32)),
    (),
    "m-9",
)
VECTORS = [
    (
        TEXT_SEND,
        "51494d4301010000000461636d650200000005616c696365030000000770686f6e652d3104000000"
        "0767656e6572616c05000000063031485a5833060000000474657874070000000008000000026869"
        "0900000001000a0000000b0000000100000003626f620b00000000",
        "51494d4401e0cbd06bb81f348c222b6ae9d5b86f2d458d46e214d2875e4e35f889a92cfe67",
    ),
    (
        REF_SEND,
        "51494d4301010000000461636d650200000005616c696365030000000770686f6e652d3104000000"
        "0767656e6572616c05000000063031485a58340600000005696d6167650700000000080000000009"
        "00000059010000000873333a2f2f622f6b000000000000002a000000406162616261626162616261"
        "62616261626162616261626162616261626162616261626162616261626162616261626162616261"
        "626162616261626162616261620a00000004000000000b000000036d2d39",
        "51494d4401a91be799f19fa1c5db6e15fd1e4dd0c419ecae21f818df9347b9a6147287c7c1",
    ),
]


def test_vectors_whole_and_digest_forms() -> None:
    for send, whole, digest in VECTORS:
        assert send.canonical_identity().hex() == whole
        assert send.reserve_identity_digest().hex() == digest


def test_digest_is_domain_separated_sha256_of_the_whole_form() -> None:
    whole = TEXT_SEND.canonical_identity()
    expected = b"QIMD\x01" + hashlib.sha256(b"message-committer/identity/v1\x00" + whole).digest()
    assert TEXT_SEND.reserve_identity_digest() == expected
    assert len(expected) == identity.DIGEST_LENGTH
    assert hashlib.sha256(whole).digest() not in expected  # not a bare hash


def test_both_stored_forms_match_the_same_send_only() -> None:
    for stored in (TEXT_SEND.canonical_identity(), TEXT_SEND.reserve_identity_digest()):
        assert TEXT_SEND.matches_identity(stored)
        for other in (
            dataclasses.replace(TEXT_SEND, device="web"),
            dataclasses.replace(TEXT_SEND, mentions=()),
            dataclasses.replace(TEXT_SEND, mentions=("bob", "carol")),
            dataclasses.replace(TEXT_SEND, reply_to="m-1"),
            dataclasses.replace(TEXT_SEND, content=MessageContent(MessageType.TEXT, b"hi!")),
        ):
            assert not other.matches_identity(stored)
    assert not TEXT_SEND.matches_identity(b"XXXX\x01whatever")
    assert identity.as_digest(TEXT_SEND.canonical_identity()) == TEXT_SEND.reserve_identity_digest()


def test_field_boundaries_cannot_be_shifted() -> None:
    a = dataclasses.replace(TEXT_SEND, tenant="ab", sender="c")
    b = dataclasses.replace(TEXT_SEND, tenant="a", sender="bc")
    assert a.canonical_identity() != b.canonical_identity()
    m1 = dataclasses.replace(TEXT_SEND, mentions=("ab", "c"))
    m2 = dataclasses.replace(TEXT_SEND, mentions=("a", "bc"))
    assert m1.reserve_identity_digest() != m2.reserve_identity_digest()
