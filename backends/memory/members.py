"""The memory MembershipStore: versioned members as intervals (``service.domain.membership``)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from backends.memory.state import Conversation, MemoryState
from service.domain import membership as rules
from service.domain.errors import StoreAlreadyExists, StoreInvalid, StoreNotFound
from service.domain.model import Admission, MembershipInfo, MembersSlice
from service.domain.ports import MembershipStore


def admission_of(conv: Conversation, user: str) -> Admission:
    """``user``'s admission to ``conv`` at its current version (the membership
    lookup's answer, and what the store's admitting reserve decides by)."""
    return Admission(conv.version, rules.is_member(conv.intervals.get(user, ())))


class MemoryMembershipStore(MembershipStore):
    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def conversation(self, tenant: str, conversation: str) -> Conversation:
        conv = self.state.conversations.get((tenant, conversation))
        if conv is None:
            raise StoreNotFound("conversation not found")
        return conv

    @staticmethod
    def _info(tenant: str, conversation: str, conv: Conversation) -> MembershipInfo:
        return MembershipInfo(tenant, conversation, conv.version, conv.member_count)

    async def create_conversation(
        self, tenant: str, conversation: str, members: Iterable[str]
    ) -> MembershipInfo:
        if (tenant, conversation) in self.state.conversations:
            raise StoreAlreadyExists("conversation already exists")
        conv = Conversation()
        users = sorted(set(members))
        conv.joined(users)
        conv.intervals = {u: (1,) for u in users}
        conv.member_count = len(users)
        self.state.conversations[(tenant, conversation)] = conv
        return self._info(tenant, conversation, conv)

    async def add_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return self._change(tenant, conversation, users, add=True)

    async def remove_members(
        self, tenant: str, conversation: str, users: Iterable[str]
    ) -> MembershipInfo:
        return self._change(tenant, conversation, users, add=False)

    def _change(
        self, tenant: str, conversation: str, users: Iterable[str], *, add: bool
    ) -> MembershipInfo:
        conv = self.conversation(tenant, conversation)
        version = conv.version + 1
        change = rules.added if add else rules.removed
        updates = {}
        for user in set(users):
            before = conv.intervals.get(user, ())
            after = change(before, version)
            if after != before:
                updates[user] = after
        if updates:
            conv.intervals.update(updates)
            if add:
                conv.joined(list(updates))
            else:
                conv.left(list(updates), version)
            conv.version = version
            conv.member_count += len(updates) if add else -len(updates)
        return self._info(tenant, conversation, conv)

    async def admission(self, tenant: str, conversation: str, user: str) -> Admission | None:
        conv = self.state.conversations.get((tenant, conversation))
        if conv is None:
            return None
        return admission_of(conv, user)

    async def member_intervals(
        self, tenant: str, conversation: str, user: str
    ) -> rules.Intervals | None:
        conv = self.state.conversations.get((tenant, conversation))
        return None if conv is None else conv.intervals.get(user, ())

    async def members_at(
        self, tenant: str, conversation: str, version: int | None, after: str, limit: int
    ) -> MembersSlice:
        conv = self.conversation(tenant, conversation)
        at = conv.version if version is None else version
        if not 1 <= at <= conv.version:
            raise StoreInvalid("the conversation never had this membership version")
        start = bisect.bisect_right(conv.current, after) if after else 0
        budget = max(1, limit) * rules.LISTING_BUDGET
        users = conv.current[start : start + budget]
        current = [(u, conv.intervals[u]) for u in users]
        first = bisect.bisect_right(conv.removals, (at, "\U0010ffff"))
        removed = [
            (user, conv.intervals[user])
            for version, user in conv.removals[first:]
            if conv.intervals[user][-1] == version  # still where this removal left it
        ]
        full = start + budget < len(conv.current)
        found, next_after = rules.listing_page(at, after, limit, current, full, removed)
        return MembersSlice(tuple(found), at, next_after)

    async def membership_info(self, tenant: str, conversation: str) -> MembershipInfo | None:
        conv = self.state.conversations.get((tenant, conversation))
        return None if conv is None else self._info(tenant, conversation, conv)
