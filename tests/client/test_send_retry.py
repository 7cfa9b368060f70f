"""Unknown outcomes, reconnect backoff and supervisor failures (issue 22, items
3, 4 and 6), against a real in-process server whose store fails on demand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from client import (
    ClientRuntime,
    ConnectionChanged,
    ConnectionState,
    ConnectRequest,
    GrpcConnector,
    RuntimeStopped,
    SendConfirmed,
    SendFailed,
    SendMessage,
    open_local_store,
)
from client.transport import CallTimeouts, GrpcServerApi
from service.domain.errors import Unavailable
from service.domain.model import AuthenticatedSend, CommittedMessage
from tests.client.conftest import NewClient
from tests.client.support import FAST, MemoryServers, eventually, text
from toolkit.campaign.faulty import CallFault
from toolkit.client_campaign.host import LateTarget

pytestmark = pytest.mark.e2e


def _states(events: Sequence[object], state: ConnectionState) -> list[ConnectionChanged]:
    return [e for e in events if isinstance(e, ConnectionChanged) and e.state is state]


async def test_a_commit_unavailable_past_the_old_attempt_budget_is_still_confirmed(
    servers: MemoryServers, new_client: NewClient
) -> None:
    quick = replace(FAST, retry_initial_s=0.005, retry_max_s=0.02)
    alice = new_client("alice", config=quick)
    await alice.start()
    await alice.online()
    assert servers.store is not None
    servers.store.inject("reserve", CallFault.FAIL, times=60)  # the old budget was 50
    cmid = await alice.send("general", "through a long outage")

    async def confirmed() -> bool:
        return any(isinstance(e, SendConfirmed) and e.cmid == cmid for e in alice.events)

    await eventually(confirmed, 60)
    assert servers.store.faults.fired[("reserve", CallFault.FAIL)] == 60
    assert not [e for e in alice.events if isinstance(e, SendFailed)]


class CommitsRefusedApi(GrpcServerApi):
    """The real server for everything but Commit, which answers UNAVAILABLE (as a
    backend that refuses writes while reads go on)."""

    async def commit(self, send: AuthenticatedSend) -> CommittedMessage:
        raise Unavailable("writes are refused right now")


@dataclass(frozen=True)
class CommitsRefused:
    target: Callable[[], str]

    def open(self, timeouts: CallTimeouts) -> GrpcServerApi:
        return CommitsRefusedApi(GrpcConnector(self.target()), timeouts)


async def test_a_connection_whose_commits_fail_backs_off_instead_of_cycling(
    servers: MemoryServers, tmp_path: Path
) -> None:
    slow = replace(FAST, reconnect_initial_s=0.05, reconnect_max_s=1.0)
    store = await open_local_store(tmp_path / "alice.db")
    runtime = ClientRuntime(store, CommitsRefused(lambda: servers.target), config=slow)
    events: list[object] = []

    async def read() -> None:
        with contextlib.suppress(RuntimeStopped):
            for _ in range(100_000):
                events.append(await runtime.next_event())

    reader = asyncio.create_task(read())
    try:
        await runtime.connect(ConnectRequest("acme", "alice", "phone"))
        await eventually(lambda: _is_online(runtime))
        await runtime.send_message(SendMessage("general", text("never through")))
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3.0)  # the window in which cycles are counted
        elapsed = loop.time() - start
    finally:
        await runtime.close()
        await reader
    cycles = len(_states(events, ConnectionState.CONNECTING)) - 1
    # doubling from 0.05 s (jittered to half) to 1 s: at most ~8 cycles in 3 s
    assert 1 <= cycles <= 10, (cycles, elapsed)


async def _is_online(runtime: ClientRuntime) -> bool:
    return runtime.state is ConnectionState.ONLINE


@dataclass
class FailingOnce:
    """A connector whose first ``open`` raises, as a bad address would."""

    inner: LateTarget
    opened: list[int] = field(default_factory=list)

    def open(self, timeouts: CallTimeouts) -> GrpcServerApi:
        self.opened.append(1)
        if len(self.opened) == 1:
            raise ValueError("no such address")
        return self.inner.open(timeouts)


async def test_a_connector_that_raises_is_an_event_with_a_reason_and_the_cycle_goes_on(
    servers: MemoryServers, tmp_path: Path
) -> None:
    store = await open_local_store(tmp_path / "alice.db")
    connector = FailingOnce(LateTarget(lambda: servers.target))
    runtime = ClientRuntime(store, connector, config=FAST)
    seen: list[object] = []
    try:
        await runtime.connect(ConnectRequest("acme", "alice", "phone"))

        async def online() -> bool:  # every event, never blocked for good
            seen.append(await asyncio.wait_for(runtime.next_event(), 5.0))
            return runtime.state is ConnectionState.ONLINE

        await eventually(online, 15)
    finally:
        await runtime.close()
    [down] = _states(seen, ConnectionState.DISCONNECTED)
    assert "ValueError" in down.reason
    assert len(connector.opened) == 2
