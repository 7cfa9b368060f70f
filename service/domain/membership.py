"""Versioned membership: who is a member at which membership version (DESIGN §9).

Every change of a conversation's members makes a new version. A user's
membership is a list of half-open version intervals ``[since, until)``; the
last one may be open (still a member). Stored flat as ``(s1, u1, s2, u2, ..,
sk)``: an odd length means the last interval is open. A version's member set
is never rewritten, only extended: closing an interval at version ``v`` does
not change who was a member at any version below ``v``, so a send frozen at
(conversation, version) keeps its recipients whatever happens later.

This module is the one place the rules live. The memory and Scylla backends
call it; the Redis scripts mirror it in Lua, and one case table
(``tests/unit/test_membership.py``, run against both) keeps them equal.

==========================  ==================  ===========================
intervals before            change at v          intervals after
==========================  ==================  ===========================
()                          add                 (v,)
(s,)                        add                 (s,)         already a member
(s, u)                      add                 (s, u, v)    re-added
(s,)                        remove              (s, v)
()  or  (s, u)              remove              unchanged    not a member
==========================  ==================  ===========================

A change at ``v`` that leaves a user's intervals unchanged is not a change;
a call whose users all stay unchanged does not make a new version.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Sequence

from service.domain.errors import InvalidRequest

Intervals = tuple[int, ...]


def is_member(intervals: Sequence[int]) -> bool:
    """Whether the user is a member at the current version (the last interval is open)."""
    return len(intervals) % 2 == 1


def member_at(intervals: Sequence[int], version: int) -> bool:
    """Whether the user was a member at ``version``."""
    for i in range(0, len(intervals), 2):
        since = intervals[i]
        until = intervals[i + 1] if i + 1 < len(intervals) else None
        if since <= version and (until is None or version < until):
            return True
    return False


def added(intervals: Intervals, version: int) -> Intervals:
    """The intervals after adding the user at ``version`` (unchanged if a member)."""
    return intervals if is_member(intervals) else (*intervals, version)


def removed(intervals: Intervals, version: int) -> Intervals:
    """The intervals after removing the user at ``version`` (unchanged if not a member)."""
    return (*intervals, version) if is_member(intervals) else intervals


def encode(intervals: Sequence[int]) -> str:
    """The stored text form, ``"s1,u1,s2"`` (the Redis scripts read and write it)."""
    return ",".join(str(v) for v in intervals)


def decode(text: str) -> Intervals:
    """Intervals from ``encode``'s form; ValueError when malformed or not increasing."""
    values = tuple(int(part) for part in text.split(",")) if text else ()
    if any(b <= a for a, b in itertools.pairwise(values)) or any(v < 0 for v in values):
        raise ValueError("membership intervals must be increasing versions")
    return values


# --- one page of a version's members -----------------------------------------------

LISTING_BUDGET = 4
"""Current members a backend reads per member asked for in one call."""

Listed = tuple[str, Sequence[int]]
"""A user and its intervals, as a listing reads them."""


def listing_page(
    version: int,
    after: str,
    limit: int,
    current: Sequence[Listed],
    current_full: bool,
    removed: Sequence[Listed],
) -> tuple[list[str], str]:
    """The members at ``version`` after ``after``, in id order, at most ``limit``, and
    the ``next_after`` to go on from ("" at the end): every backend's one rule.

    A backend keeps the current members in id order and the users who are members no
    more by the version they were last removed at. A member at ``version`` is either
    a member now or was last removed after ``version``, so a listing reads ``current``
    (the current members after ``after``, in id order; ``current_full`` when more may
    follow its last) and ``removed`` (every user last removed after ``version``, any
    order): O(members at the version + users changed since), never the users who left
    before it. Users in ``removed`` past the last of a full ``current`` wait for the
    next call. Both are read in one atomic step (one script, one partition read)."""
    high = current[-1][0] if current_full and current else None
    candidates = [*current]
    candidates += [(u, iv) for u, iv in removed if u > after and (high is None or u <= high)]
    candidates.sort(key=lambda listed: listed[0])
    found = [user for user, intervals in candidates if member_at(intervals, version)]
    if len(found) > limit:
        return found[:limit], found[limit - 1]
    return found, high or ""


# --- the page token of ListMembers --------------------------------------------------

_TOKEN_VERSION = b"m1"


def page_token(version: int, after: str) -> str:
    """An opaque token for "members of ``version`` after user ``after``".

    Opaque on purpose: clients pass it back unchanged. Listing continues at
    the version the first page was read at, so a change between pages does
    not skip or repeat members.
    """
    raw = _TOKEN_VERSION + b"\x00" + str(version).encode() + b"\x00" + after.encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_page_token(token: str) -> tuple[int, str]:
    """(version, after) of a ``page_token``; InvalidRequest for anything else."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        tag, version, after = raw.split(b"\x00", 2)
        if tag != _TOKEN_VERSION or not version.isdigit() or not after:
            raise ValueError
        return int(version), after.decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("page_token is not one this service issued") from None
