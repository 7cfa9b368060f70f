"""Membership changes cost O(users changed), never O(members) (DESIGN §9).

A call of 10,000 users is one conditional batch, so one version, and the
requests it takes are the same whether the conversation has 10,000 or
40,000 members: the reads name only the call's users. (The same holds at a
million members; docs/scylla.md has the timings of that run.)
"""

from __future__ import annotations

from collections import Counter

import pytest

from service.domain.ports import Backend
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, members, send, unique

pytestmark = [pytest.mark.scylla, pytest.mark.slow]

CALL = 10_000


def _users(start: int, count: int) -> list[str]:
    return [f"member-{i:07d}" for i in range(start, start + count)]


async def _counted(backend: Backend, coro: object) -> tuple[object, Counter[str]]:
    backend.requests.clear()
    result = await coro  # type: ignore[misc]
    return result, Counter(backend.requests)


async def test_a_10k_change_costs_the_same_at_10k_and_40k_members(
    scylla: ScyllaHarness,
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    m = backend.membership
    created = await m.create_conversation(tenant, "big", _users(0, CALL))
    assert (created.version, created.member_count) == (1, CALL)
    small, small_cost = await _counted(backend, m.add_members(tenant, "big", _users(CALL, CALL)))
    for start in (2 * CALL, 3 * CALL):
        await m.add_members(tenant, "big", _users(start, CALL))
    large, large_cost = await _counted(
        backend, m.add_members(tenant, "big", _users(4 * CALL, CALL))
    )
    assert (small.version, small.member_count) == (2, 2 * CALL)  # type: ignore[attr-defined]
    assert (large.version, large.member_count) == (5, 5 * CALL)  # type: ignore[attr-defined]
    assert small_cost == large_cost, (small_cost, large_cost)
    assert small_cost["lwt"] == 1 and small_cost["statement"] <= CALL // 100 + 2

    removed, removal_cost = await _counted(
        backend, m.remove_members(tenant, "big", _users(CALL // 2, CALL))
    )
    assert (removed.version, removed.member_count) == (6, 4 * CALL)  # type: ignore[attr-defined]
    assert removal_cost == small_cost

    c = committer(backend)
    backend.requests.clear()
    await c.commit_send(send(tenant, "big", sender="member-0000001"))
    assert backend.requests["statement"] <= 16  # a send never reads the member set
    with pytest.raises(Exception, match="not a member"):
        await c.commit_send(send(tenant, "big", sender=_users(CALL // 2, 1)[0]))
    page = await m.members_at(tenant, "big", 1, "", 1000)
    assert page.members == tuple(_users(0, 1000))
    assert len(await members(backend, tenant, "big", 5, page=1000)) == 5 * CALL
