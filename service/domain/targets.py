"""Who gets an outbox entry (DESIGN §9-10): its frozen recipients' inboxes, or
the conversation's own lane when it has more members than the fan-out
threshold (sticky once the lane exists). Decided once per (conversation,
membership version) and cached, in O(1) reads for a lane that exists or a
current version whose member count settles it, else by paging the members of
that version 1,000 at a time. Stdlib-only, used by ``relay_worker``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from service.domain.delivery import DeliveryPorts
from service.domain.errors import StoreError, StoreInvalid, StoreNotFound
from service.domain.mailbox import Mailbox
from service.domain.model import OutboxEntry
from service.domain.ports import MembershipStore

MAX_MEMBER_CALLS = 10_000
TARGET_CACHE_SIZE = 10_000


MEMBER_PAGE = 1000
"""Members asked per listing call, however few the decision still needs: a backend
examines a bounded multiple of the count asked per call (Redis, Scylla: 4x), so
users who left long ago cost one call per ~4,000 of them, not one per few."""


@dataclass(frozen=True, slots=True)
class _Refused:
    """A listing that failed for good (its version or conversation is gone): every
    entry of that version is refused the same way without another walk."""

    kind: type[StoreError]
    problem: str


class Targets:
    """Who gets an entry: its frozen recipients' inboxes, or the conversation's own
    lane when it has more members than the threshold (sticky once it has one).

    Decided once per (conversation, membership version) and cached: a lane that
    exists settles it with one read; else the current member count settles it
    when the version is the current one; only otherwise are the members listed."""

    def __init__(self, ports: DeliveryPorts, membership: MembershipStore, threshold: int) -> None:
        self._ports = ports
        self._membership = membership
        self._threshold = threshold
        self._cache: OrderedDict[tuple[str, str, int], tuple[Mailbox, ...] | _Refused] = (
            OrderedDict()
        )

    async def of(self, entry: OutboxEntry) -> tuple[Mailbox, ...]:
        if entry.recipients is not None:  # release 1: recipients frozen inline
            return await self._decide(entry.tenant, entry.conversation, list(entry.recipients))
        key = (entry.tenant, entry.conversation, entry.membership_version)
        found = self._cache.get(key)
        if found is None:
            try:
                found = await self._resolve(*key)
            except (StoreInvalid, StoreNotFound) as exc:
                found = _Refused(type(exc), str(exc))
            self._cache[key] = found
            if len(self._cache) > TARGET_CACHE_SIZE:
                self._cache.popitem(last=False)
        if isinstance(found, _Refused):
            raise found.kind(found.problem)
        return found

    async def _resolve(self, tenant: str, conversation: str, version: int) -> tuple[Mailbox, ...]:
        lane = Mailbox.conversation(tenant, conversation)
        if await self._has_lane(lane):  # it was big once: it stays big, whoever is left
            return (lane,)
        info = await self._membership.membership_info(tenant, conversation)
        if info is not None and info.version == version and info.member_count > self._threshold:
            return (lane,)
        members = set(await self._members(tenant, conversation, version))
        if len(members) > self._threshold:
            return (lane,)
        return tuple(Mailbox.inbox(tenant, user) for user in sorted(members))

    async def _members(self, tenant: str, conversation: str, version: int) -> list[str]:
        """The members at ``version``, or the first threshold + 1 of them."""
        members: list[str] = []
        after = ""
        for _ in range(MAX_MEMBER_CALLS):
            want = max(self._threshold + 1 - len(members), MEMBER_PAGE)
            page = await self._membership.members_at(tenant, conversation, version, after, want)
            members += page.members
            after = page.next_after
            if not after or len(members) > self._threshold:
                return members
        raise StoreInvalid("the membership listing did not end")

    async def _has_lane(self, lane: Mailbox) -> bool:
        (state,) = await self._ports.mailbox.lane_state([lane])
        return state.head > 0 or state.epoch > 1

    async def _decide(
        self, tenant: str, conversation: str, members: list[str]
    ) -> tuple[Mailbox, ...]:
        lane = Mailbox.conversation(tenant, conversation)
        if len(set(members)) > self._threshold or await self._has_lane(lane):
            return (lane,)
        return tuple(Mailbox.inbox(tenant, user) for user in sorted(set(members)))
