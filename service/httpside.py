"""The HTTP side port: /metrics, /healthz and /readyz, on the server's own loop.

A deliberately tiny HTTP/1.1 server on ``asyncio.start_server`` (no web
framework is needed for three GET routes): one request per connection, a
bounded request head, a read timeout, ``Connection: close``.

* ``/metrics``: the server's CollectorRegistry in the Prometheus text format;
* ``/healthz``: liveness, 200 whenever this loop is able to answer;
* ``/readyz``: readiness, 200 or 503 from the last real probe, with its
  short reason (backend name and exception type only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service.health import Readiness

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 5.0
TEXT = "text/plain; charset=utf-8"


class HttpSide:
    """Serves the three routes until ``close``."""

    def __init__(self, registry: CollectorRegistry, readiness: Callable[[], Readiness]) -> None:
        self._registry = registry
        self._readiness = readiness
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port); returns the bound port."""
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def route(self, method: str, path: str) -> tuple[HTTPStatus, str, bytes]:
        """The status, content type and body for one request."""
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, TEXT, b"only GET and HEAD\n"
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return HTTPStatus.OK, TEXT, b"ok\n"
        if path == "/readyz":
            state = self._readiness()
            code = HTTPStatus.OK if state.ready else HTTPStatus.SERVICE_UNAVAILABLE
            return code, TEXT, f"{state.reason}\n".encode()
        return HTTPStatus.NOT_FOUND, TEXT, b"not found; try /metrics, /healthz or /readyz\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                status, ctype, body = HTTPStatus.BAD_REQUEST, TEXT, b"bad request\n"
                method = "GET"
            else:
                method = parts[0]
                status, ctype, body = self.route(method, parts[1])
            writer.write(
                (
                    f"HTTP/1.1 {status.value} {status.phrase}\r\n"
                    f"Content-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                ).encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a slow, truncated or oversized request gets no answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
