"""ACK and PONG timeouts against a real ``serve`` process frozen with SIGSTOP:
the connection stays open but nothing comes back, so only the runtime's own
deadlines can notice. Both leave ONLINE, and the runtime reconnects with
backoff once the server thaws."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from client import ConnectionChanged, ConnectionState, SendConfirmed
from tests.client.support import FAST, TENANT, Client, admin, eventually, history
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
