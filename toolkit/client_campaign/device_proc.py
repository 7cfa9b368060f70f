"""The parent's handle on a device process (``device.device_main``): spawn it from
a forkserver with the client modules preloaded (a spawn costs a fork, not an
interpreter start), send commands, collect every event it reports over all its
incarnations, SIGKILL it.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from toolkit.client_campaign.device import device_main

PRELOAD = ["client", "grpc", "toolkit.client_campaign.device", "toolkit.client_campaign.servers"]
REPLY_TIMEOUT_S = 30.0


def forkserver_context() -> BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


@dataclass
class DeviceProc:
    user: str
    device: str
    path: Path
    context: BaseContext
    config: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    """Every event reported, over all incarnations; ``{"ev": "started"}`` marks each."""
    incarnations: int = 0
    _process: Any = None
    _conn: Connection | None = None
    _replies: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def deaths_file(self) -> Path:
        return self.path.with_name(self.path.name + ".deaths")

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def running(self) -> bool:
        return self._process is not None

    def start(self, target: str, arm: tuple[str, ...] = ()) -> None:
        parent, child = self.context.Pipe()
        spec = {
            "path": str(self.path),
            "target": target,
            "user": self.user,
            "device": self.device,
            "config": self.config,
            "arm": list(arm),
            "log": f"{self.path}.log",  # the runtime's own account, beside its store
        }
        self._replies = asyncio.Queue()
        process = self.context.Process(target=device_main, args=(child, spec), daemon=True)  # type: ignore[attr-defined]
        process.start()
        child.close()
        self._process, self._conn = process, parent
        self.incarnations += 1
        self.events.append({"ev": "started"})
        asyncio.get_running_loop().add_reader(parent.fileno(), self._readable, parent)

    def _readable(self, conn: Connection) -> None:
        try:
            while conn.poll():
                event: dict[str, Any] = json.loads(conn.recv_bytes())
                if event["ev"] in ("persisted", "refused", "armed", "status", "error"):
                    self._replies.put_nowait(event)
                else:
                    self.events.append(event)
        except (EOFError, OSError):
            self._detach(conn)
            self._replies.put_nowait({"ev": "dead"})

    def _detach(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(conn.fileno())

    async def command(self, **command: Any) -> dict[str, Any]:
        """One command and its answer; ``{"ev": "dead"}`` when the process died."""
        if self._conn is None:
            return {"ev": "dead"}
        async with self._lock:
            try:
                self._conn.send_bytes(json.dumps(command).encode())
            except OSError:
                return {"ev": "dead"}
            try:
                return await asyncio.wait_for(self._replies.get(), REPLY_TIMEOUT_S)
            except TimeoutError:
                return {"ev": "dead", "why": "no reply"}

    async def kill(self) -> None:
        """SIGKILL (whatever it was doing), wait for it, close the pipe."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None:
            return
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        await asyncio.to_thread(process.join, 30.0)
        if conn is not None:
            try:
                self._readable(conn)  # what it said before it died
            finally:
                if not conn.closed:
                    self._detach(conn)
                    conn.close()

    def deaths(self) -> list[str]:
        """The fault points this device died at (the child writes each before SIGKILL)."""
        try:
            return self.deaths_file.read_text().split()
        except FileNotFoundError:
            return []
