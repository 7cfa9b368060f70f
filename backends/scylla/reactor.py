"""The driver's connections on the service's own asyncio loop (no I/O thread).

The driver's default (libev) runs every socket in a thread of its own: each
response is decoded there, then handed to the asyncio loop through
``call_soon_threadsafe`` (a write to the loop's self-pipe) and the GIL changes
hands twice. Measured on the test box, that hand-off and the libev glue were
a large share of the CPU of a request, and each request left its
``ResponseFuture`` in a reference cycle with its timeout ``Timer``, so every
request also fed the cyclic garbage collector.

``loop_connection_class(loop)`` returns a ``Connection`` class bound to
``loop``:

* reads: ``loop.add_reader`` on the socket; responses are decoded, and the
  request callbacks run, on the loop's thread, so a result reaches its
  awaiting coroutine with a plain ``set_result``;
* writes: ``push`` queues the frame and schedules one flush per loop
  iteration (frames pushed in the same iteration go out in one ``send``);
  a socket that is not writable gets ``loop.add_writer`` until drained;
* timers (the driver's per-request timeout): ``loop.call_later`` handles; a
  cancelled handle drops its callback, which breaks the future↔timer cycle;
* calls from the driver's own threads (connection set-up, heartbeats, the
  control connection's refreshes) reach the loop with
  ``call_soon_threadsafe``. Those threads block on their own events, never
  the loop; nothing on the loop thread blocks (``CqlSession`` runs
  ``Cluster.connect`` and ``shutdown`` in worker threads).

TLS is not spoken here: with TLS to the cluster (``tls.py``) the backend uses
the driver's own reactor instead, and this class refuses an SSL context rather
than silently sending in clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from cassandra.connection import Connection, ConnectionShutdown

_CLOSE_WAIT_S = 5.0
_RETRY = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)


class LoopTimer:
    """A driver timer as a ``loop.call_later`` handle, armable from any thread."""

    __slots__ = ("_cancelled", "_handle", "_loop", "_thread")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, thread: int, timeout: float, callback: Any
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._cancelled = False
        self._handle: asyncio.TimerHandle | None = None
        if threading.get_ident() == thread:
            self._handle = loop.call_later(max(0.0, timeout), callback)
        else:
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing waits any more
                loop.call_soon_threadsafe(self._arm, timeout, callback)

    def _arm(self, timeout: float, callback: Any) -> None:
        if not self._cancelled:
            self._handle = self._loop.call_later(max(0.0, timeout), callback)

    def cancel(self) -> None:
        self._cancelled = True
        handle = self._handle
        if handle is None:
            return
        self._handle = None
        if threading.get_ident() == self._thread:
            handle.cancel()
        else:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(handle.cancel)


class LoopConnection(Connection):  # type: ignore[misc]  # the driver is untyped
    """A driver connection whose socket is served by ``_loop`` (see the module docs)."""

    _loop: asyncio.AbstractEventLoop
    _thread: int
    is_closed: bool
    is_defunct: bool

    @classmethod
    def initialize_reactor(cls) -> None:
        return None

    @classmethod
    def handle_fork(cls) -> None:
        return None

    @classmethod
    def create_timer(cls, timeout: float, callback: Any) -> LoopTimer | asyncio.TimerHandle:
        """On the loop's thread (every request's timeout) the loop's own handle;
        elsewhere a LoopTimer that arms itself on the loop."""
        if threading.get_ident() == cls._thread:
            return cls._loop.call_later(max(0.0, timeout), callback)
        return LoopTimer(cls._loop, cls._thread, timeout, callback)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Connection.__init__(self, *args, **kwargs)
        if self.ssl_context is not None or self.ssl_options:
            raise ConnectionShutdown("TLS is not supported on the loop connection")
        self._out: deque[bytes] = deque()
        self._pending = b""
        self._flush_scheduled = False
        self._writer = False
        self._attached = False
        self._connect_socket()
        self._socket.setblocking(False)
        # Frames are coalesced per loop iteration already; Nagle would hold the
        # next write back for the server's delayed ACK.
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._fd = self._socket.fileno()
        self._call(self._attach)
        self._send_options_message()

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop: now when already there, else soon."""
        if threading.get_ident() == self._thread:
            fn()
        else:
            self._loop.call_soon_threadsafe(fn)

    def _attach(self) -> None:
        if self.is_closed or self.is_defunct:
            return
        self._loop.add_reader(self._fd, self._on_readable)
        self._attached = True

    # --- writing -----------------------------------------------------------------

    def push(self, data: bytes) -> None:
        self._out.append(data)
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        try:
            if threading.get_ident() == self._thread:
                self._loop.call_soon(self._flush)
            else:
                self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError as exc:  # the loop is closed
            self.defunct(exc)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._writer or self.is_closed:
            return  # the writer callback drains, or nothing to write to
        self._send()

    def _send(self) -> None:
        out = self._out
        if out:
            chunks = [self._pending] if self._pending else []
            while out:
                chunks.append(out.popleft())
            self._pending = b"".join(chunks)
        data = self._pending
        while data:
            try:
                sent = self._socket.send(data)
            except OSError as exc:
                if exc.errno in _RETRY:
                    break
                self.defunct(exc)
                return
            if sent <= 0:
                break
            data = data[sent:]
        self._pending = data
        if data and not self._writer:
            self._loop.add_writer(self._fd, self._on_writable)
            self._writer = True
        elif not data and self._writer:
            self._loop.remove_writer(self._fd)
            self._writer = False

    def _on_writable(self) -> None:
        if self.is_closed:
            return
        self._send()

    # --- reading -----------------------------------------------------------------

    def _on_readable(self) -> None:
        if self.is_closed:
            return
        size = self.in_buffer_size
        try:
            while True:
                buf = self._socket.recv(size)
                self._iobuf.write(buf)
                if len(buf) < size:
                    break
        except OSError as exc:
            if exc.errno not in _RETRY:
                self.defunct(exc)
                return
            if not self._iobuf.tell():
                return
        if self._iobuf.tell():
            self.process_io_buffer()
        else:
            self.close()  # closed by the server

    # --- closing -----------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            if self.is_closed:
                return
            self.is_closed = True
        if threading.get_ident() == self._thread:
            self._teardown()
        else:
            done = threading.Event()

            def teardown() -> None:
                try:
                    self._teardown()
                finally:
                    done.set()

            try:
                self._loop.call_soon_threadsafe(teardown)
            except RuntimeError:  # the loop is gone: nobody else touches the socket
                self._socket.close()
            else:
                done.wait(_CLOSE_WAIT_S)
        if not self.is_defunct:
            msg = f"Connection to {self.endpoint} was closed"
            if self.last_error:
                msg += f": {self.last_error}"
            self.error_all_requests(ConnectionShutdown(msg))
            self.connected_event.set()

    def _teardown(self) -> None:
        if self._attached:
            self._loop.remove_reader(self._fd)
            self._attached = False
        if self._writer:
            self._loop.remove_writer(self._fd)
            self._writer = False
        self._socket.close()


def loop_connection_class(loop: asyncio.AbstractEventLoop) -> type[LoopConnection]:
    """A ``Connection`` class bound to ``loop`` (the calling thread's running loop)."""
    return type(
        "BoundLoopConnection",
        (LoopConnection,),
        {"_loop": loop, "_thread": threading.get_ident()},
    )
