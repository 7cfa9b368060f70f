"""Nothing on the event loop waits for a stream.

The driver's ``execute_async`` borrows a stream id in the caller's thread, and
``HostConnection.borrow_connection(timeout=2.0)`` waits on a
``threading.Condition`` when the connection has no stream free, or when it was
closed by a driver thread but is still in the pool. On the loop thread that wait
cannot end early: responses are decoded on the loop (``reactor.py``), so nothing
frees a stream meanwhile, and every RPC, deadline and health check stalls for
the whole 2 s (4 s with the direct path's own borrow before it, as it was).

So the direct path borrows with ``timeout=0`` (``direct.py``), and the driver's
path (``CqlSession._driver_send``) calls ``execute_async`` on the loop only while
``streams_free`` shows that its borrow cannot wait: every pooled connection open,
with more than ``STREAM_MARGIN`` streams to spare (other threads borrow too). Else
``OffLoop`` runs it on one of its own threads, where the borrow may wait while
the loop keeps answering, and frees the streams the wait is for. A request that
no thread has started by its deadline fails as never sent (``NoHostAvailable``).

One window is left: a driver thread may close a connection in the microseconds
between ``streams_free`` and the borrow on the loop. That borrow then waits
(at most 2 s) as before; nothing else does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from cassandra.cluster import NoHostAvailable, Session

STREAM_MARGIN = 64
"""Streams a connection must have to spare for a borrow on the loop."""
WORKERS = 4


def streams_free(session: Session) -> bool:
    """No borrow of the driver's can wait now (False when it cannot tell)."""
    try:
        for pool in tuple(session._pools.values()):
            if pool.is_shutdown:
                continue  # the driver skips it at once
            for connection in tuple(pool._connections.values()):
                if connection.is_closed or connection.is_defunct:
                    return False
                if connection.in_flight >= connection.max_request_id - STREAM_MARGIN:
                    return False
        return True
    except (AttributeError, RuntimeError, TypeError):  # another driver, or changed meanwhile
        return False


class OffLoop:
    """Starts driver requests on threads of its own, within their deadline."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="cql-borrow")
        self.started = 0
        """Requests handed to these threads (a stream was not free on the loop)."""

    def submit(
        self, start: Callable[[float], None], fail: Callable[[BaseException], None], limit_s: float
    ) -> None:
        """``start(remaining_s)`` on a thread; ``fail`` when it raises or the deadline
        passed before a thread got to it."""
        deadline = time.monotonic() + limit_s
        self.started += 1

        def run() -> None:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise NoHostAvailable("no stream was free before the deadline", {})
                start(remaining)
            except BaseException as exc:
                fail(exc)

        try:
            self._executor.submit(run)
        except RuntimeError as exc:  # shut down: the session is closing
            fail(exc)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._executor.shutdown(wait=False)
