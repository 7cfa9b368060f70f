"""Count CQL requests on the wire: a TCP proxy in front of a CQL node.

A client connects to the proxy instead of the node (only loopback addresses);
every byte is forwarded unchanged, and the frames the client sends are
counted by opcode (CQL native protocol v3/v4: a 9-byte header, the opcode at
offset 4, the body length at 5..8). ``requests`` are QUERY, EXECUTE and BATCH
frames; ``conditional`` those among them that run a conditional statement
(``INSERT/UPDATE/DELETE ... IF``): the proxy learns which prepared ids are
conditional from the PREPARE requests and their RESULT responses, so it must
see the client connect. Compressed frames cannot be looked into (counted as
``compressed``); the Scylla backend does not compress.

This is the service-independent count the Scylla cost targets are checked
against (the backend's own counter must agree with it). In-process use:
``async with WireCounter(host, port) as wire: ... wire.snapshot()``. As a
process of its own (so its CPU is not the measured server's)::

    python -m toolkit.bench.cqlwire --target 127.0.0.1:9042

prints ``listen <port> control <port>``; a connection to the control port
reads the counts as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import re
import struct
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from types import TracebackType

HEADER = 9
OPCODES = {
    0x01: "startup",
    0x05: "options",
    0x07: "query",
    0x09: "prepare",
    0x0A: "execute",
    0x0B: "register",
    0x0D: "batch",
    0x0F: "auth_response",
}
REQUESTS = ("query", "execute", "batch")
_RESULT, _PREPARED = 0x08, 0x0004
_CONDITIONAL = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b.*\bIF\b", re.IGNORECASE | re.DOTALL)
_CHUNK = 65536
Frame = tuple[int, int, int, bytes]
Look = Callable[[Frame, dict[int, str]], None]


def _long_string(body: bytes, at: int) -> tuple[str, int]:
    (size,) = struct.unpack_from(">i", body, at)
    return body[at + 4 : at + 4 + size].decode("utf-8", "replace"), at + 4 + size


def _short_bytes(body: bytes, at: int) -> tuple[bytes, int]:
    (size,) = struct.unpack_from(">H", body, at)
    return body[at + 2 : at + 2 + size], at + 2 + size


class _Stream:
    """One direction of one connection: complete frames out of arbitrary chunks."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def frames(self, data: bytes) -> list[Frame]:
        """(flags, stream, opcode, body) of every frame completed by ``data``."""
        self._buffer += data
        found = []
        while len(self._buffer) >= HEADER:
            flags, stream, opcode, length = struct.unpack_from(">BhBi", self._buffer, 1)
            if len(self._buffer) < HEADER + length:
                break
            body = bytes(self._buffer[HEADER : HEADER + length])
            del self._buffer[: HEADER + length]
            found.append((flags, stream, opcode, body))
        return found


class WireCounter:
    """The proxy and its counts (see the module docs)."""

    def __init__(self, host: str, port: int, *, listen_host: str = "127.0.0.1") -> None:
        for address in (host, listen_host):
            if not ipaddress.ip_address(address).is_loopback:
                raise ValueError("the wire counter proxies loopback addresses only")
        self._target = (host, port)
        self._listen_host = listen_host
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.counts: Counter[str] = Counter()
        self._conditional_ids: set[bytes] = set()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self._listen_host, 0)
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> WireCounter:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        prepares: dict[int, str] = {}
        pumps = (
            asyncio.create_task(self._pump(reader, up_writer, self._request, prepares)),
            asyncio.create_task(self._pump(up_reader, writer, self._response, prepares)),
        )
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        look: Look,
        prepares: dict[int, str],
    ) -> None:
        frames = _Stream()
        while data := await source.read(_CHUNK):
            sink.write(data)
            for frame in frames.frames(data):
                look(frame, prepares)
            await sink.drain()

    def _request(self, frame: Frame, prepares: dict[int, str]) -> None:
        flags, stream, opcode, body = frame
        name = OPCODES.get(opcode, f"opcode_{opcode:#x}")
        self.counts[name] += 1
        if name in REQUESTS:
            self.counts["requests"] += 1
        if flags & 0x01:
            self.counts["compressed"] += 1
            return
        if name == "prepare":
            prepares[stream] = _long_string(body, 0)[0]
        elif self._conditional(name, body):
            self.counts["conditional"] += 1

    def _conditional(self, name: str, body: bytes) -> bool:
        if name == "query":
            return bool(_CONDITIONAL.match(_long_string(body, 0)[0]))
        if name == "execute":
            return _short_bytes(body, 0)[0] in self._conditional_ids
        return name == "batch" and self._batch_is_conditional(body)

    def _response(self, frame: Frame, prepares: dict[int, str]) -> None:
        flags, stream, opcode, body = frame
        query = prepares.pop(stream, None)
        if query is None or opcode != _RESULT or flags & 0x01 or len(body) < 4:
            return
        if struct.unpack_from(">i", body, 0)[0] == _PREPARED and _CONDITIONAL.match(query):
            self._conditional_ids.add(_short_bytes(body, 4)[0])

    def _batch_is_conditional(self, body: bytes) -> bool:
        (count,) = struct.unpack_from(">H", body, 1)
        at = 3
        for _ in range(count):
            kind = body[at]
            if kind == 0:
                query, at = _long_string(body, at + 1)
                if _CONDITIONAL.match(query):
                    return True
            else:
                statement, at = _short_bytes(body, at + 1)
                if statement in self._conditional_ids:
                    return True
            (values,) = struct.unpack_from(">H", body, at)
            at += 2
            for _ in range(values):
                (size,) = struct.unpack_from(">i", body, at)
                at += 4 + max(0, size)
        return False


async def _serve(target: tuple[str, int]) -> None:
    wire = WireCounter(*target)
    await wire.start()

    async def report(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps(wire.snapshot()).encode() + b"\n")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    control = await asyncio.start_server(report, "127.0.0.1", 0)
    control_port = control.sockets[0].getsockname()[1]
    print(f"listen {wire.port} control {control_port}", flush=True)
    await asyncio.Event().wait()  # until the parent stops this process


async def read_counts(control_port: int) -> Counter[str]:
    """The counts of a proxy process, by its control port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", control_port)
    try:
        line = await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()  # else the transport outlives a loop closed after us
    return Counter({str(k): int(v) for k, v in json.loads(line).items()})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.cqlwire", description=__doc__)
    parser.add_argument("--target", required=True, help="the CQL node, host:port (loopback)")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve((host, int(port))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
