"""Who gets an outbox entry (DESIGN §9-10): its frozen recipients' inboxes, or
the conversation's own lane when it has more members than the fan-out
threshold (sticky once the lane exists). Decided once per (conversation,
membership version) and cached, in O(1) reads for a lane that exists or a
current version whose member count settles it, else by paging the members of
that version 1,000 at a time. Stdlib-only, used by ``relay_worker``.

Sticky means per conversation, not per version: once the lane exists (this
relay chose it, or it read a lane some relay wrote), every later entry of the
conversation goes there, whatever its version was decided as. A decision for
the inboxes is trusted only under the lease it was checked under: another
holder of the partition may have made the lane in between.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from service.domain.delivery import DeliveryPorts
from service.domain.errors import StoreError, StoreInvalid, StoreNotFound
from service.domain.mailbox import Mailbox
from service.domain.model import OutboxEntry
from service.domain.ports import MembershipStore
from service.domain.relay import Fence

MAX_MEMBER_CALLS = 10_000
TARGET_CACHE_SIZE = 10_000
"""Conversations whose decisions a relay keeps (each with its versions)."""


MEMBER_PAGE = 1000
"""Members asked per listing call, however few the decision still needs: a listing
costs one call per 1,000 members of the version (plus the users who joined or left
after it), never per user the conversation ever had."""


@dataclass(frozen=True, slots=True)
class _Refused:
    """A listing that failed for good (its version or conversation is gone): every
    entry of that version is refused the same way without another walk."""

    kind: type[StoreError]
    problem: str


Decision = tuple[Mailbox, ...] | _Refused


@dataclass(slots=True)
class _Known:
    """What this relay knows of one conversation."""

    laned: bool = False
    """Its own lane exists, or this relay chose it: sticky."""
    checked: Fence | None = None
    """The lease under which ``laned`` was last read from the lane."""
    versions: dict[int, Decision] = field(default_factory=dict)


class Targets:
    """Who gets an entry: its frozen recipients' inboxes, or the conversation's own
    lane when it has more members than the threshold (sticky once it has one).

    Decided once per (conversation, membership version) and cached: a lane that
    exists settles it with one read (once per conversation and lease); else the
    current member count settles it when the version is the current one; only
    otherwise are the members listed."""

    def __init__(self, ports: DeliveryPorts, membership: MembershipStore, threshold: int) -> None:
        self._ports = ports
        self._membership = membership
        self._threshold = threshold
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()

    async def of(self, entry: OutboxEntry, fence: Fence | None = None) -> tuple[Mailbox, ...]:
        """The entry's target mailboxes. ``fence``: the lease the caller holds the
        entry's partition under (None: read the lane again)."""
        known = await self._conversation(entry.tenant, entry.conversation, fence)
        lane = Mailbox.conversation(entry.tenant, entry.conversation)
        if known.laned:  # it was big once: it stays big, whoever is left
            return (lane,)
        found = await self._own(entry, known)
        known.laned = found == (lane,)
        return found

    async def own(self, entry: OutboxEntry) -> tuple[Mailbox, ...]:
        """Where the entry's own version sends it, lane or not: where an entry
        delivered before its conversation got its lane may be (reconciliation)."""
        key = (entry.tenant, entry.conversation)
        return await self._own(entry, self._known.get(key) or _Known())

    async def _own(self, entry: OutboxEntry, known: _Known) -> tuple[Mailbox, ...]:
        if entry.recipients is not None:  # release 1: recipients frozen inline
            inline = set(entry.recipients)
            found: Decision = self._by_count(entry.tenant, entry.conversation, inline)
        else:
            version = entry.membership_version
            cached = known.versions.get(version)
            if cached is None:
                try:
                    cached = await self._resolve(entry.tenant, entry.conversation, version)
                except (StoreInvalid, StoreNotFound) as exc:
                    cached = _Refused(type(exc), str(exc))
                known.versions[version] = cached
            found = cached
        if isinstance(found, _Refused):
            raise found.kind(found.problem)
        return found

    async def _conversation(self, tenant: str, conversation: str, fence: Fence | None) -> _Known:
        key = (tenant, conversation)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = _Known()
            if len(self._known) > TARGET_CACHE_SIZE:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(key)
        if not known.laned and (fence is None or known.checked != fence):
            known.laned = await self._has_lane(Mailbox.conversation(tenant, conversation))
            known.checked = fence
        return known

    async def _resolve(self, tenant: str, conversation: str, version: int) -> tuple[Mailbox, ...]:
        info = await self._membership.membership_info(tenant, conversation)
        if info is not None and info.version == version and info.member_count > self._threshold:
            return (Mailbox.conversation(tenant, conversation),)
        members = await self._members(tenant, conversation, version)
        return self._by_count(tenant, conversation, members)

    def _by_count(self, tenant: str, conversation: str, members: set[str]) -> tuple[Mailbox, ...]:
        if len(members) > self._threshold:
            return (Mailbox.conversation(tenant, conversation),)
        return tuple(Mailbox.inbox(tenant, user) for user in sorted(members))

    async def _members(self, tenant: str, conversation: str, version: int) -> set[str]:
        """The members at ``version``, or the first threshold + 1 of them."""
        members: set[str] = set()
        after = ""
        for _ in range(MAX_MEMBER_CALLS):
            want = max(self._threshold + 1 - len(members), MEMBER_PAGE)
            page = await self._membership.members_at(tenant, conversation, version, after, want)
            members.update(page.members)
            after = page.next_after
            if not after or len(members) > self._threshold:
                return members
        raise StoreInvalid("the membership listing did not end")

    async def _has_lane(self, lane: Mailbox) -> bool:
        (state,) = await self._ports.mailbox.lane_state([lane])
        return state.head > 0 or state.epoch > 1
