"""KeySpace keeps the keys it built for a conversation, within a bound."""

from __future__ import annotations

import pytest

from backends.redis import keys as keys_module
from backends.redis.keys import KeySpace


def test_a_conversations_keys_are_built_once_and_are_the_same_keys() -> None:
    space = KeySpace("mc", 16)
    first = space.conversation("t", "c:1/é")
    assert space.conversation("t", "c:1/é") is first
    assert KeySpace("mc", 16).conversation("t", "c:1/é") == first  # as built afresh
    assert space.conversation("t2", "c:1/é") != first  # the tenant is part of the key


def test_the_kept_keys_are_bounded_oldest_dropped_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys_module, "CACHED_CONVERSATIONS", 3)
    space = KeySpace("mc", 16)
    made = [space.conversation("t", f"c{i}") for i in range(5)]
    assert space.conversation("t", "c4") is made[4]  # kept
    assert space.conversation("t", "c0") is not made[0]  # dropped, built again
    assert space.conversation("t", "c0") == made[0]
    assert len(space._conversations) == 3
