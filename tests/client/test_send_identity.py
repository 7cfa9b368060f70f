"""A pending send is confirmed only by a message with its own identity (issue 22,
item 2): two devices of one user that use one cmid for different content."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from client import SendConfirmed, SendFailed, SendMessage
from client.faults import ClientPoint
from tests.client.support import Client, MemoryServers, eventually, history, text

pytestmark = pytest.mark.e2e


async def _crashed(client: Client) -> bool:
    return client.rt.crash is not None


def _failed(client: Client, cmid: str) -> list[SendFailed]:
    return [e for e in client.events if isinstance(e, SendFailed) and e.cmid == cmid]


async def test_another_devices_message_with_the_same_cmid_is_a_conflict_not_a_confirmation(
    servers: MemoryServers, tmp_path: Path
) -> None:
    laptop = Client("alice", tmp_path / "laptop.db", lambda: servers.target, device="laptop")
    phone = Client("alice", tmp_path / "phone.db", lambda: servers.target, device="phone")
    try:
        await laptop.start()
        await laptop.online()
        laptop.faults.arm(ClientPoint.ATTEMPT_BEFORE_SEND)  # counted, never sent
        await laptop.send("general", "from the laptop", cmid="shared-1")
        await eventually(lambda: _crashed(laptop))
        await laptop.crash()

        await phone.start()
        await phone.online()
        await phone.send("general", "from the phone", cmid="shared-1")
        await eventually(lambda: _no_pending(phone))

        await laptop.start()

        async def parked() -> bool:
            return bool(_failed(laptop, "shared-1"))

        await eventually(parked, 5)
        [failed] = _failed(laptop, "shared-1")
        assert failed.error == "IdempotencyConflict"
        assert not [e for e in laptop.events if isinstance(e, SendConfirmed)]
        [p] = await laptop.rt.store.pending()
        assert p.cmid == "shared-1" and p.parked and p.send.device == "laptop"
        [record] = await history(servers.target, "general", "alice")
        assert record.device == "phone" and record.content.body == b"from the phone"
    finally:
        await laptop.crash()
        await phone.crash()


async def _no_pending(client: Client) -> bool:
    return not await client.rt.store.pending()


async def test_generated_cmids_carry_the_device(servers: MemoryServers, tmp_path: Path) -> None:
    laptop = Client("alice", tmp_path / "laptop.db", lambda: servers.target, device="laptop")
    try:
        await laptop.start()
        pending = await laptop.rt.send_message(SendMessage("general", text("hi")))
        assert pending.cmid.startswith("laptop-")
    finally:
        await laptop.crash()


async def test_a_repeated_send_after_a_cancellation_neither_fails_nor_duplicates(
    servers: MemoryServers, tmp_path: Path
) -> None:
    """The host passes its own id; whatever a cancelled call did, calling again
    with that id is safe (issue 22, item 5)."""
    alice = Client("alice", tmp_path / "alice.db", lambda: servers.target)
    try:
        await alice.start()
        await alice.online()
        cmids = [f"host-{i}" for i in range(20)]
        for cmid in cmids:
            message = SendMessage("general", text(f"body {cmid}"), cmid)
            call = asyncio.create_task(alice.rt.send_message(message))
            await asyncio.sleep(0)  # the write has started in the store's thread
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
        await eventually(lambda: _no_pending(alice))
        for cmid in cmids:  # the host does not know what happened: it asks again
            again = await alice.rt.send_message(SendMessage("general", text(f"body {cmid}"), cmid))
            assert again.cmid == cmid
        await eventually(lambda: _no_pending(alice))
        records = await history(servers.target, "general", "alice")
        assert sorted(r.cmid for r in records) == sorted(cmids)
    finally:
        await alice.crash()
