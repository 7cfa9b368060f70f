"""ACK and PONG timeouts against a real ``serve`` process frozen with SIGSTOP:
the connection stays open but nothing comes back, so only the runtime's own
deadlines can notice. Both leave ONLINE, and the runtime reconnects with
backoff once the server thaws."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from client import (
    ClientRuntime,
    ConnectionChanged,
    ConnectionState,
    ConnectRequest,
    GrpcConnector,
    SendConfirmed,
    SendMessage,
    open_local_store,
)
from tests.client.support import FAST, TENANT, Client, admin, eventually, history, text
from tests.e2e.process import ServeProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    process = ServeProcess(["--subscribe-poll-interval", "50ms", "--relay-idle-wait", "50ms"])
    try:
        yield process
    finally:
        if process.process.poll() is None:
            process.process.send_signal(signal.SIGCONT)
        process.close()


async def _setup(serve: ServeProcess, tmp_path: Path, **config: float) -> Client:
    async with await admin(serve.target) as c:
        await c.create_conversation(TENANT, "general", ["alice", "bob"])
    alice = Client("alice", tmp_path / "alice.db", lambda: serve.target)
    alice.config = replace(FAST, **config)  # type: ignore[arg-type]
    await alice.start()
    await alice.online()
    return alice


def _left_online(client: Client) -> list[ConnectionChanged]:
    return [
        e
        for e in client.events
        if isinstance(e, ConnectionChanged) and e.state is ConnectionState.DISCONNECTED
    ]


async def test_a_silent_stream_is_a_pong_timeout_and_the_runtime_reconnects(
    serve: ServeProcess, tmp_path: Path
) -> None:
    alice = await _setup(serve, tmp_path, heartbeat_s=1, pong_timeout_s=2.5)
    serve.process.send_signal(signal.SIGSTOP)
    await eventually(lambda: _disconnected(alice), 10)
    [left] = _left_online(alice)
    assert left.reason.startswith("PONG timeout")
    serve.process.send_signal(signal.SIGCONT)
    await alice.online(20)
    await alice.crash()


async def test_a_commit_past_its_deadline_is_an_ack_timeout_and_is_reconciled(
    serve: ServeProcess, tmp_path: Path
) -> None:
    alice = await _setup(serve, tmp_path, heartbeat_s=1, pong_timeout_s=30, ack_timeout_s=1)
    serve.process.send_signal(signal.SIGSTOP)
    cmid = await alice.send("general", "are you there?")
    await eventually(lambda: _disconnected(alice), 10)
    assert _left_online(alice)[0].reason.startswith("ACK timeout")
    assert [p.cmid for p in await alice.rt.store.pending()] == [cmid]
    serve.process.send_signal(signal.SIGCONT)
    await eventually(lambda: _confirmed(alice, cmid), 30)
    assert [r.cmid for r in await history(serve.target, "general", "alice")] == [cmid]
    await alice.crash()


async def _disconnected(client: Client) -> bool:
    return bool(_left_online(client))


async def _confirmed(client: Client, cmid: str) -> bool:
    return any(isinstance(e, SendConfirmed) and e.cmid == cmid for e in client.events)


async def test_the_runtime_config_sets_the_deadlines_of_a_connector_built_as_a_host_builds_it(
    serve: ServeProcess, tmp_path: Path
) -> None:
    """A host writes ``GrpcConnector(target)`` and puts its deadlines in
    ``RuntimeConfig``: a 1 s ACK deadline leaves ONLINE about 1 s after the send
    to a frozen server, not after a connector default of its own (10 s)."""
    async with await admin(serve.target) as c:
        await c.create_conversation(TENANT, "general", ["alice", "bob"])
    config = replace(FAST, heartbeat_s=1, pong_timeout_s=30, ack_timeout_s=1)
    store = await open_local_store(tmp_path / "alice.db")
    runtime = ClientRuntime(store, GrpcConnector(serve.target), config=config)
    try:
        await runtime.connect(ConnectRequest(TENANT, "alice", "phone"))
        await eventually(lambda: _state_is(runtime, ConnectionState.ONLINE))
        serve.process.send_signal(signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        await runtime.send_message(SendMessage("general", text("are you there?")))
        await eventually(lambda: _state_is_not(runtime, ConnectionState.ONLINE), 15)
        waited = loop.time() - sent_at
        # 1 s deadline; 5 s is slack for a loaded machine and well under 10 s
        assert waited < 5.0, f"left ONLINE {waited:.1f}s after the send"
    finally:
        serve.process.send_signal(signal.SIGCONT)
        await runtime.close()


async def _state_is(runtime: ClientRuntime, state: ConnectionState) -> bool:
    return runtime.state is state


async def _state_is_not(runtime: ClientRuntime, state: ConnectionState) -> bool:
    return runtime.state is not state
