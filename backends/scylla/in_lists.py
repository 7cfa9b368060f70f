"""Reads whose last restriction is ``column IN ?``, cut to what ScyllaDB takes.

ScyllaDB refuses a query restricting more than
``max_clustering_key_restrictions_per_query`` (100 by default) clustering keys;
Cassandra takes any number, so the test node would never show it. Every
``IN`` read of the backend goes through ``read_in``: lists of at most
``MAX_IN`` values, a bounded number in flight, rows concatenated in list order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from backends.scylla.session import CqlSession, Row

MAX_IN = 100
"""Values per ``IN`` list: ScyllaDB's default limit of clustering keys per query."""
IN_CONCURRENCY = 8
"""Chunks of one read in flight at once."""


def chunks(values: Sequence[Any], size: int = MAX_IN) -> list[list[Any]]:
    """``values`` cut into lists of at most ``size``, in order."""
    return [list(values[i : i + size]) for i in range(0, len(values), size)]


async def read_in(
    cql: CqlSession,
    name: str,
    prefix: tuple[Any, ...],
    values: Sequence[Any],
    *,
    serial: bool = False,
) -> list[Row]:
    """The rows of statement ``name`` for ``prefix`` and each chunk of ``values``
    (bound last, as the statement's ``IN ?``), at serial consistency with ``serial``;
    no call for an empty list."""
    rows: list[Row] = []
    parts = chunks(values)
    for start in range(0, len(parts), IN_CONCURRENCY):
        replies = await asyncio.gather(
            *(
                cql.read(name, (*prefix, part), serial=serial)
                for part in parts[start : start + IN_CONCURRENCY]
            )
        )
        for reply in replies:
            rows += reply
    return rows
