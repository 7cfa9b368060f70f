"""Scripts sent on a pooled connection directly: one write, the replies read in order.

The round trips that carry WAIT come here (Redis holds the connection that sent
WAIT until the replicas answer, so it cannot be the one every caller shares);
the others share one connection (``backends/redis/shared.py``).

A commit's scripts went through redis-py's client objects: a command by
``Redis.execute_command``, several by a ``Pipeline``. Both add per call what
the backend never uses (a pipeline object made and reset, the driver's
optional-command preparation, reply callbacks looked up, the driver's own
metrics hooks); without them the bench's fresh commits ran 14 % faster on
12 % less server CPU each (docs/performance.md). ``exchange`` keeps the parts
that matter and takes them from the driver's public connection API:

* the pool's connection (``get_connection`` / ``release``: the blocking
  pool's bound and wait stay);
* the connection's own send and read (``send_packed_command``,
  ``read_response``): a timeout, a reset or a cancellation mid-way closes
  the connection there, so a half-read connection never goes back in use;
  a Sentinel-managed connection still finds the master and drops a demoted
  one;
* the connection's retry (``_Retry`` in link.py): a failed connection is
  closed and everything sent again, except for a script that is not safe to
  repeat (``_once``), exactly as the driver's calls do;
* every reply read before an error reply is raised (the first one), as a
  pipeline does, so the connection stays in step.

Only for commands whose replies the driver returns unchanged (EVALSHA,
INCR, WAIT): no reply callback is applied. An error reply is raised as the
server sent it (a driver pipeline prefixes the command, arguments included,
to its text).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

from redis import exceptions as rx

Arg = str | bytes | int | float  # a command's argument, as the backend sends them
INSTRUMENTATION = "opentelemetry.instrumentation.redis"  # the otel extra's, service/otel.py


def driver_traced() -> bool:
    """Is redis-py traced? Its instrumentation patches the driver's client calls,
    not these, and cannot be on before its module is imported (an optional
    extra: without it, nothing is imported here)."""
    module = sys.modules.get(INSTRUMENTATION)
    if module is None:
        return False
    # one instance per instrumentor class: the one service/otel.py turned on
    return bool(module.RedisInstrumentor().is_instrumented_by_opentelemetry)


async def exchange(pool: Any, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    """``commands`` on one of ``pool``'s connections in one round trip; the replies
    in order, or the first error reply raised once every reply is read."""
    connection = await pool.get_connection()
    try:
        replies = await connection.retry.call_with_retry(
            lambda: _send_and_read(connection, commands),
            lambda _error: connection.disconnect(),
        )
    finally:
        await pool.release(connection)
    return cast(list[Any], replies)


async def _send_and_read(connection: Any, commands: Sequence[Sequence[Arg]]) -> list[Any]:
    await connection.send_packed_command(connection.pack_commands(commands))
    return await read_replies(connection, len(commands))


async def read_replies(connection: Any, count: int) -> list[Any]:
    """The next ``count`` replies on ``connection``, or the first error reply among
    them raised once all are read (the connection stays in step)."""
    replies: list[Any] = []
    first_error: rx.ResponseError | None = None
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except rx.ResponseError as error:  # the reply was read: the next ones follow
            replies.append(error)
            first_error = first_error or error
    if first_error is not None:
        raise first_error
    return replies
