"""The delivery soak's checker (``toolkit/soak/ledger.py``) on made-up histories: a clean
one passes; a duplicate, a missing entry, a reused seq and a stray message are each caught."""

from __future__ import annotations

from toolkit.soak.ledger import Key, Ledger, Observations, Seen, check

SMALL: Key = ("small", "ann", "c1")
BIG: Key = ("big", "bob", "c2")


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.add_conversation("small", frozenset({"ann", "bob"}), threshold=2)
    ledger.add_conversation("big", frozenset({"ann", "bob", "cat"}), threshold=2)
    ledger.ack(SMALL, "m1")
    ledger.ack(BIG, "m2")
    return ledger


def _clean() -> Observations:
    seen = Observations()
    seen.see("inbox:ann", 1, 1, Seen(SMALL, "m1"))
    seen.see("inbox:bob", 1, 1, Seen(SMALL, "m1"))
    seen.see("conversation:big", 1, 1, Seen(BIG, "m2"))
    seen.see("conversation:big", 1, 1, Seen(BIG, "m2"))  # read again by another member
    return seen


def test_a_clean_history_has_no_violation() -> None:
    found = check(_ledger(), _clean())
    assert found.violations == []
    assert found.checked == 3  # two inboxes and one lane


def test_a_duplicate_in_one_epoch_is_caught_but_one_per_epoch_is_not() -> None:
    seen = _clean()
    seen.see("inbox:ann", 1, 2, Seen(SMALL, "m1"))
    seen.see("inbox:bob", 2, 1, Seen(SMALL, "m1"))  # a new epoch holds it again: fine
    found = check(_ledger(), seen)
    assert found.duplicates == ["duplicate: inbox:ann epoch 1 holds small/ann/c1 (m1) 2 times"]
    assert len(found.violations) == 1


def test_a_missing_entry_is_caught() -> None:
    seen = Observations()
    seen.see("inbox:ann", 1, 1, Seen(SMALL, "m1"))
    seen.see("conversation:big", 1, 1, Seen(BIG, "m2"))
    found = check(_ledger(), seen)
    assert found.missing == ["missing: small/ann/c1 (m1) in inbox:bob"]
    assert len(found.violations) == 1


def test_a_reused_seq_is_caught_when_seen() -> None:
    ledger = _ledger()
    other: Key = ("small", "bob", "c3")
    ledger.ack(other, "m3")
    seen = _clean()
    seen.see("inbox:ann", 1, 2, Seen(other, "m3"))
    seen.see("inbox:bob", 1, 2, Seen(other, "m3"))
    seen.see("inbox:ann", 1, 1, Seen(other, "m3"))  # seq 1 of epoch 1 given out again
    found = check(ledger, seen)
    assert found.reused == ["reused seq: inbox:ann epoch 1 seq 1 showed m1 and later m3"]
    assert found.reused[0] in found.violations


def test_stray_entries_are_caught() -> None:
    seen = _clean()
    seen.see("inbox:cat", 1, 1, Seen(SMALL, "m1"))  # cat is not in "small"
    seen.see("inbox:ann", 1, 2, Seen(("small", "ann", "never"), "m9"))
    seen.see("inbox:ann", 1, 3, Seen(("small", "bob", "c1"), "m1"))  # another key
    seen.see("inbox:bob", 1, 2, Seen(SMALL, "m7"))  # not the ACKed id
    found = check(_ledger(), seen)
    assert sorted(s.split(":")[0] for s in found.stray) == [
        "another message id than its ACK's m1",
        "never sent",
        "never sent",
        "not addressed to this mailbox",
    ]
    assert len(found.violations) == 4


def test_an_unknown_send_may_show_once_but_not_twice() -> None:
    ledger = _ledger()
    maybe: Key = ("small", "bob", "c4")
    ledger.lost_track(maybe)
    seen = _clean()
    seen.see("inbox:ann", 1, 2, Seen(maybe, "m4"))
    assert check(ledger, seen).violations == []
    seen.see("inbox:ann", 1, 3, Seen(maybe, "m4"))
    assert len(check(ledger, seen).duplicates) == 1


def test_a_lost_commit_seen_in_an_epoch_the_lane_left_is_healed_not_a_violation() -> None:
    seen = _clean()
    seen.see("inbox:ann", 1, 2, Seen(("small", "ann", "lost"), "m8"))  # its commit was lost
    seen.see("inbox:ann", 2, 1, Seen(SMALL, "m1"))  # the relay started epoch 2
    found = check(_ledger(), seen)
    assert found.violations == []
    assert found.healed == ["never sent: inbox:ann epoch 1 seq 2 m8"]


def test_another_message_of_the_same_key_does_not_stand_in_for_the_acked_one() -> None:
    later: Key = ("small", "bob", "c9")
    seen = Observations()
    seen.see("inbox:ann", 1, 1, Seen(SMALL, "m1"))
    seen.see("conversation:big", 1, 1, Seen(BIG, "m2"))
    seen.see("inbox:bob", 1, 1, Seen(SMALL, "m0"))  # a lost first commit of the key
    seen.see("inbox:bob", 2, 1, Seen(later, "m9"))  # bob's inbox went on in epoch 2
    seen.see("inbox:ann", 1, 2, Seen(later, "m9"))
    ledger = _ledger()
    ledger.ack(later, "m9")
    found = check(ledger, seen)
    assert found.missing == ["missing: small/ann/c1 (m1) in inbox:bob"]
    assert found.healed == ["another message id than its ACK's m1: inbox:bob epoch 1 seq 1 m0"]


def test_a_message_the_readers_rebuilt_after_is_not_missing() -> None:
    ledger = _ledger()
    ledger.ack(SMALL, "m1", at=10.0)
    seen = Observations()
    seen.see("inbox:ann", 1, 1, Seen(SMALL, "m1"), at=11.0)
    seen.see("conversation:big", 1, 1, Seen(BIG, "m2"), at=11.0)
    seen.see("inbox:bob", 1, 1, Seen(("small", "bob", "x"), "m5"), at=5.0)
    assert check(ledger, seen).missing == ["missing: small/ann/c1 (m1) in inbox:bob"]
    seen.see("inbox:bob", 3, 1, Seen(("small", "bob", "x"), "m5"), at=12.0)  # a new epoch
    found = check(ledger, seen)
    assert found.missing == []
    assert found.rebuilt == ["missing: small/ann/c1 (m1) in inbox:bob (rebuilt at epoch 3)"]
