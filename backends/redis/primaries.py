"""Direct connections to a Redis Cluster's primaries, for commands that must share
one connection with a write.

``WAIT`` counts the writes of *its own connection*. A Cluster client sends a
keyless ``WAIT`` to every primary and adds the answers up, which says nothing
about the write just made. To wait for a commit's replicas on a Cluster, the
commit's script and its ``WAIT`` go, pipelined, over a direct connection to the
primary that owns the commit's slot (found in the Cluster client's slot map).
A slot that moved answers ``MOVED``: the send is then recoverable and the slot
map is refreshed, so the retry reaches the new owner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis import exceptions as rx
from redis.asyncio import BlockingConnectionPool, Redis

from backends.redis.connections import use_backend_connections
from backends.redis.exchange import Arg


class PrimaryConnections:
    """One small pool per Cluster primary, opened on first use."""

    def __init__(self, cluster: Any, options: dict[str, Any]) -> None:
        self._cluster = cluster
        self._options = options
        self._clients: dict[tuple[str, int], Redis] = {}

    def for_key(self, key: str) -> Redis:
        """The direct client of the primary that owns ``key``'s slot."""
        node = self._cluster.get_node_from_key(key)
        if node is None:
            raise rx.ClusterDownError("no primary owns the slot")
        where = (str(node.host), int(node.port))
        client = self._clients.get(where)
        if client is None:
            pool = BlockingConnectionPool(host=where[0], port=where[1], **self._options)
            use_backend_connections(pool)
            client = self._clients[where] = Redis.from_pool(pool)
        return client

    async def pipelined(self, key: str, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """``commands`` on one connection to ``key``'s primary, in one round trip."""
        try:
            async with self.for_key(key).pipeline(transaction=False) as pipe:
                for command in commands:
                    cast(Callable[..., object], pipe.execute_command)(*command)
                return list(await pipe.execute())
        except (rx.ConnectionError, rx.TimeoutError, rx.ResponseError):
            await self.refresh()  # a failover or a moved slot: learn the new owner
            raise

    async def refresh(self) -> None:
        """Reload the Cluster client's slot map (best effort: the next call retries)."""
        with contextlib.suppress(rx.RedisError, OSError):
            await self._cluster.nodes_manager.initialize()

    async def close(self) -> None:
        """Close every pool (again on a second call: a pipeline in flight during the
        first may have opened a connection since); a later use reconnects."""
        for client in list(self._clients.values()):
            with contextlib.suppress(rx.RedisError, OSError):
                await client.aclose(close_connection_pool=True)
