"""How many RPCs a replica serves at once: unary RPCs and streams counted apart.

gRPC's own ``maximum_concurrent_rpcs`` counts a stream for its whole life, so
as many idle Subscribe streams as the limit made Commit and Sync answer
RESOURCE_EXHAUSTED. Here unary RPCs have ``MC_MAX_CONCURRENT_RPCS`` slots;
server streams have ``MC_MAX_STREAMS`` of their own, and at most
``MC_MAX_STREAMS_PER_USER`` per (tenant, user) when the request names one
(Subscribe). The defaults live in ``service/config.py``.
The interceptor takes a slot before the handler runs and gives it back when
the RPC ends, whatever the outcome.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RpcLimits:
    """In-flight counters; a ``take_*`` that answers a refusal took nothing.
    The limits come from ``ServiceConfig`` (``max_concurrent_rpcs``, ``max_streams``,
    ``max_streams_per_user``)."""

    max_unary: int = 0
    """0 (here and below): no limit."""
    max_streams: int = 0
    max_streams_per_user: int = 0
    unary: int = 0
    streams: int = 0
    per_user: Counter[tuple[str, str]] = field(default_factory=Counter)

    def take_unary(self) -> str | None:
        """None when a slot was taken, else why not."""
        if self.max_unary and self.unary >= self.max_unary:
            return f"more than {self.max_unary} RPCs in flight on this replica; retry later"
        self.unary += 1
        return None

    def give_unary(self) -> None:
        self.unary -= 1

    def take_stream(self, owner: tuple[str, str] | None) -> str | None:
        """None when a slot was taken (and one of ``owner``'s), else why not."""
        if self.max_streams and self.streams >= self.max_streams:
            return f"more than {self.max_streams} streams on this replica; retry later"
        per_user = self.max_streams_per_user
        if owner is not None and per_user and self.per_user[owner] >= per_user:
            return f"more than {self.max_streams_per_user} streams per user on this replica"
        self.streams += 1
        if owner is not None:
            self.per_user[owner] += 1
        return None

    def give_stream(self, owner: tuple[str, str] | None) -> None:
        self.streams -= 1
        if owner is not None:
            self.per_user[owner] -= 1
            if self.per_user[owner] <= 0:
                del self.per_user[owner]


def owner_of(request: object) -> tuple[str, str] | None:
    """The (tenant, user) a streaming request names, if it names one."""
    tenant, user = getattr(request, "tenant", None), getattr(request, "user", None)
    if isinstance(tenant, str) and isinstance(user, str) and user:
        return (tenant, user)
    return None
