"""A relay on the server's event loop runs at most one partition step per loop turn
(issue 27): on memory a step never suspends, so when every partition had a
backlog they all stepped in the same turn and each RPC waited for all of them,
once per turn it needed (Health/Check at 10 calls/s, p99.9 4.9 s, in the bench).

The turns are counted, not timed: a callback that re-schedules itself with
``call_soon`` runs once per loop turn, and every step records the turn it ran in.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import pytest

from backends.memory import open_memory_backend
from service.domain.mailbox import Mailbox
from service.domain.ports import Backend, ManualClock
from service.domain.relay_worker import PartitionWork, StepResult
from service.relay_metrics import RelayMetrics
from service.relay_runner import RelayRunner
from tests.conformance.relay_support import POLICY, run_until_delivered
from tests.support import committer, send, unique

CONVERSATIONS = 60
PER_CONVERSATION = 3


class _Turns:
    """Counts the event loop's turns from a callback that re-arms itself."""

    def __init__(self) -> None:
        self.turn = 0
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.Handle | None = None
        self._stopped = False

    def _tick(self) -> None:
        self.turn += 1
        if not self._stopped:
            self._handle = self._loop.call_soon(self._tick)

    def start(self) -> None:
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()


async def _backlog(backend: Backend, clock: ManualClock) -> tuple[str, int]:
    """Commits spread over many partitions, none delivered yet."""
    c = committer(backend, clock)
    tenant = unique("t")
    for n in range(CONVERSATIONS):
        await backend.membership.create_conversation(tenant, f"c{n}", ["alice", "bob"])
    for m in range(PER_CONVERSATION):
        for n in range(CONVERSATIONS):
            await c.commit_send(send(tenant, f"c{n}", cmid=f"m{n}-{m}"))
    return tenant, CONVERSATIONS * PER_CONVERSATION


async def _work_off(shares_loop: bool, monkeypatch: pytest.MonkeyPatch) -> collections.Counter[int]:
    """Steps that delivered something, per loop turn, while a runner drains the backlog."""
    clock = ManualClock()
    backend = open_memory_backend(clock=clock)
    tenant, total = await _backlog(backend, clock)
    turns = _Turns()
    worked: collections.Counter[int] = collections.Counter()
    original = PartitionWork.step

    async def counted(self: PartitionWork) -> StepResult:
        turn = turns.turn
        result = await original(self)
        if result.worked:
            worked[turn] += 1
        return result

    monkeypatch.setattr(PartitionWork, "step", counted)
    policy = dataclasses.replace(POLICY, batch=1)
    runner = RelayRunner(
        backend, policy=policy, idle_wait_s=0.05, metrics=RelayMetrics(), shares_loop=shares_loop
    )
    turns.start()
    alice = Mailbox.inbox(tenant, "alice")
    await run_until_delivered(runner, backend, alice, total, before_stop=turns.stop)
    return worked


async def test_a_relay_sharing_the_loop_steps_once_per_loop_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worked = await _work_off(True, monkeypatch)
    assert sum(worked.values()) >= CONVERSATIONS * PER_CONVERSATION  # batch 1: a step each
    assert max(worked.values()) == 1, worked.most_common(3)


async def test_a_relay_in_its_own_process_still_steps_its_partitions_side_by_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``shares_loop`` (Redis, Scylla: steps await the network) partitions
    are not serialised: here, on memory, many step in the same turn."""
    worked = await _work_off(False, monkeypatch)
    assert max(worked.values()) > 1
