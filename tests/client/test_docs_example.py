"""The example at the top of docs/client.md runs, as written, against a real
in-process server (issue 22, item 7)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest

from tests.client.support import MemoryServers

pytestmark = pytest.mark.e2e
DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def _example() -> str:
    found = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found is not None, "docs/client.md has no python example"
    return found.group(1)


async def test_the_documented_example_runs(servers: MemoryServers, tmp_path: Path) -> None:
    namespace: dict[str, object] = {}
    exec(compile(_example(), str(DOC), "exec"), namespace)
    say_hi = cast(Callable[[str, str], Awaitable[list[bytes]]], namespace["say_hi"])
    async with asyncio.timeout(30):
        bodies = await say_hi(servers.target, str(tmp_path / "alice.sqlite3"))
    assert bodies == [b"hi bob"]


def test_the_public_surface_is_what_a_host_needs_and_no_test_hooks() -> None:
    """Everything in ``client.__all__`` is importable from ``client``; the fault
    points and crash type that only the test campaigns drive are not in it, and
    a host needs nothing from ``service.domain``: its types come re-exported."""
    import client

    exported = set(client.__all__)
    assert all(hasattr(client, name) for name in exported)
    assert not exported & {"ClientCrash", "ClientFaults", "ClientPoint"}
    needed = {"ClientRuntime", "RuntimeConfig", "GrpcConnector", "open_local_store"}
    needed |= {"SendMessage", "SendConfirmed", "SendFailed", "MessageContent", "MessageType"}
    assert needed <= exported
