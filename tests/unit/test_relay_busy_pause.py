"""The relay inside ``serve`` waits ``MC_RELAY_BUSY_PAUSE`` after a step that
delivered something (issue 27: fewer, fuller steps cost the server less CPU
per commit); a relay without it goes straight on. The waits are recorded, not
timed, and every message still arrives once.
"""

from __future__ import annotations

import dataclasses

import pytest

from backends.memory import open_memory_backend
from service import bootstrap, config
from service.domain.mailbox import Mailbox
from service.domain.ports import ManualClock
from service.domain.relay_worker import PartitionWork, StepResult
from service.relay_metrics import RelayMetrics
from service.relay_runner import RelayRunner
from tests.conformance.relay_support import POLICY, run_until_delivered
from tests.support import committer, send, unique

MESSAGES = 12
PAUSE_S = 0.002


async def _pauses_after_work(busy_pause_s: float, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The first wait each worked step was followed by, while a runner drains a backlog."""
    clock = ManualClock()
    backend = open_memory_backend(clock=clock)
    c = committer(backend, clock)
    tenant = unique("t")
    await backend.membership.create_conversation(tenant, "c", ["alice", "bob"])
    for m in range(MESSAGES):
        await c.commit_send(send(tenant, "c", cmid=f"m{m}"))
    after_work: list[float] = []
    last_worked = False
    step, pause = PartitionWork.step, RelayRunner._pause

    async def recorded_step(self: PartitionWork) -> StepResult:
        nonlocal last_worked
        result = await step(self)
        last_worked = result.worked
        return result

    async def recorded_pause(self: RelayRunner, seconds: float) -> None:
        nonlocal last_worked
        if last_worked:
            after_work.append(seconds)
            last_worked = False
        await pause(self, seconds)

    monkeypatch.setattr(PartitionWork, "step", recorded_step)
    monkeypatch.setattr(RelayRunner, "_pause", recorded_pause)
    runner = RelayRunner(
        backend,
        policy=dataclasses.replace(POLICY, batch=1),  # a step per message
        idle_wait_s=0.05,
        metrics=RelayMetrics(),
        shares_loop=True,
        busy_pause_s=busy_pause_s,
    )
    await run_until_delivered(runner, backend, Mailbox.inbox(tenant, "alice"), MESSAGES)
    return after_work


async def test_a_relay_with_a_busy_pause_waits_it_after_every_step_that_worked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    after_work = await _pauses_after_work(PAUSE_S, monkeypatch)
    assert len(after_work) >= MESSAGES  # batch 1: at least a worked step per message
    assert set(after_work) == {PAUSE_S}


async def test_a_relay_without_one_goes_straight_to_its_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worked step is followed by the next step, not a wait: the first wait
    comes once the partition runs dry (the quick re-checks before the doorbell)."""
    after_work = await _pauses_after_work(0.0, monkeypatch)
    assert PAUSE_S not in after_work
    assert len(after_work) <= 1


async def test_serve_gives_its_relay_the_configured_busy_pause() -> None:
    loaded = config.load({"backend": "memory"}, {"MC_RELAY_BUSY_PAUSE": "25ms"})
    server = bootstrap.build_server(loaded, open_memory_backend())
    assert server.relay is not None
    assert server.relay._busy_pause_s == 0.025
