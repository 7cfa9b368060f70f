"""One client device as a real OS process (the process mode of the campaign).

``device_main`` runs in a child process: a ``ClientRuntime`` over its own SQLite
file (``synchronous=FULL`` unless told), connected to the server, driven over a
pipe of JSON lines (``multiprocessing`` Connection bytes, one JSON object each):

==========  ===============================================================
command     the child
==========  ===============================================================
send        persists ``{conversation, cmid, size}`` (a body of ``size``
            bytes); answers ``persisted`` or ``refused`` (the runtime said no
            before persisting: its error class)
arm         arms a client fault point: when reached, the child writes the
            point to ``<db>.deaths`` and SIGKILLs itself (no close, no flush)
disarm      disarms every point
status      answers ``status``: state, pending cmids, message ids held (and
            the seq of each)
==========  ===============================================================

Every runtime event goes back as it happens (``confirmed`` with its
coordinates, ``added`` ids, ``failed`` with the error class, ``state``,
``reset``, ``rebuilt``). The parent never closes a device gracefully: it
SIGKILLs it, and the next process reopens the same file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from client import (
    ClientEvent,
    ClientRuntime,
    ClientRuntimeError,
    ConnectionChanged,
    ConnectRequest,
    GrpcConnector,
    LocalStoreReset,
    MessageContent,
    MessagesAdded,
    MessageType,
    RebuildFinished,
    RuntimeConfig,
    RuntimeStopped,
    SendConfirmed,
    SendFailed,
    SendMessage,
    open_local_store,
)
from client.faults import ClientFaults, ClientPoint

TENANT = "acme"


class KillingFaults(ClientFaults):
    """An armed point reached kills the process there and then (SIGKILL)."""

    def __init__(self, deaths: Path) -> None:
        super().__init__()
        self.deaths = deaths

    def check(self, point: ClientPoint) -> None:
        if self._armed.get(point, 0) > 0:
            fd = os.open(self.deaths, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, f"{point.value}\n".encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)


def encode(event: ClientEvent) -> dict[str, Any] | None:
    if isinstance(event, SendConfirmed):
        m = event.message
        return {
            "ev": "confirmed",
            "cmid": event.cmid,
            "conversation": m.conversation,
            "message_id": m.message_id,
            "seq": m.seq,
            "via": event.via,
        }
    if isinstance(event, MessagesAdded):
        return {"ev": "added", "ids": [m.message_id for m in event.messages]}
    if isinstance(event, SendFailed):
        return {"ev": "failed", "cmid": event.cmid, "error": event.error}
    if isinstance(event, ConnectionChanged):
        return {"ev": "state", "state": event.state.value}
    if isinstance(event, LocalStoreReset):
        return {"ev": "reset", "kept": event.kept_pending, "lost": event.lost_pending}
    if isinstance(event, RebuildFinished):
        return {"ev": "rebuilt"}
    return None


def device_main(conn: Connection, spec: dict[str, Any]) -> None:
    """The child's body: run the device until SIGKILL (or the pipe closes)."""
    logging.basicConfig(
        filename=spec.get("log"),  # every incarnation appends to the device's log
        level=logging.INFO if spec.get("log") else logging.CRITICAL,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    asyncio.run(_run(conn, spec))


async def _run(conn: Connection, spec: dict[str, Any]) -> None:
    path = Path(spec["path"])
    faults = KillingFaults(path.with_name(path.name + ".deaths"))
    for point in spec.get("arm", ()):  # a point a starting runtime passes
        faults.arm(ClientPoint(point))
    store = await open_local_store(path, synchronous=spec.get("synchronous", "FULL"), faults=faults)
    if (report := store.reset_report) is not None:  # said now: a kill may follow at once
        conn.send_bytes(
            json.dumps(
                {
                    "ev": "reset",
                    "kept": report.kept_pending,
                    "lost": report.lost_pending,
                    "at": "open",
                }
            ).encode()
        )
    runtime = ClientRuntime(
        store, GrpcConnector(spec["target"]), config=RuntimeConfig(**spec["config"]), faults=faults
    )

    def out(obj: dict[str, Any]) -> None:
        conn.send_bytes(json.dumps(obj).encode())

    await runtime.connect(ConnectRequest(TENANT, spec["user"], spec["device"]))
    out({"ev": "ready"})
    commands: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            while conn.poll():
                commands.put_nowait(json.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            commands.put_nowait(None)

    loop.add_reader(conn.fileno(), readable)

    async def events() -> None:
        while True:
            try:
                encoded = encode(await runtime.next_event())
            except RuntimeStopped:
                return
            if encoded is not None:
                out(encoded)

    reader = asyncio.create_task(events())
    for _ in range(10_000_000):
        command = await commands.get()
        if command is None:
            break
        out(await _execute(runtime, faults, command))
    reader.cancel()
    os.kill(os.getpid(), signal.SIGKILL)  # never a graceful close


async def _execute(
    runtime: ClientRuntime, faults: KillingFaults, command: dict[str, Any]
) -> dict[str, Any]:
    op = command["op"]
    if op == "arm":
        faults.arm(ClientPoint(command["point"]))
        return {"ev": "armed", "point": command["point"]}
    if op == "disarm":
        faults.disarm_all()
        return {"ev": "armed", "point": ""}
    if op == "send":
        body = b"x" * int(command["size"])
        message = SendMessage(
            command["conversation"], MessageContent(MessageType.TEXT, body), command["cmid"]
        )
        try:
            pending = await runtime.send_message(message)
        except ClientRuntimeError as exc:
            return {"ev": "refused", "cmid": command["cmid"], "error": type(exc).__name__}
        return {"ev": "persisted", "cmid": command["cmid"], "confirmed": bool(pending.confirmed)}
    if op == "status":
        held: dict[str, list[str]] = {}
        seqs: dict[str, dict[str, int]] = {}
        for conversation in command["conversations"]:
            local = await runtime.store.messages(conversation, limit=100_000)
            held[conversation] = [m.record.message_id for m in local]
            seqs[conversation] = {m.record.message_id: m.record.seq for m in local}
        pending_sends = await runtime.store.pending()
        return {
            "ev": "status",
            "state": runtime.state.value,
            "pending": [p.cmid for p in pending_sends],
            "parked": [p.cmid for p in pending_sends if p.parked],
            "held": held,
            "seqs": seqs,
        }
    return {"ev": "error", "what": f"unknown op {op}"}
