"""The connection class of every pool the Redis backend opens: the class the
driver chose for the address (TCP, TLS, Unix socket, Sentinel-managed) with
two changes mixed in.

* ``ClosedTransport``: a command written to a transport the event loop has
  already closed is a ``ConnectionError``. When redis-server dies between the
  pool's check of a connection and the write (a kill -9, a reset, a
  failover), uvloop, which ``serve`` runs on, refuses the write with
  ``RuntimeError`` ("the handler is closed"), where asyncio's own loop drops
  the bytes and lets the read report the lost connection. redis-py converts
  only ``OSError`` there, so the RuntimeError went past the backend's error
  translation and the interceptor answered INTERNAL, which a client takes as
  definitive, for a command that was never written
  (``tests/redis/test_closed_transport.py``). As a ``ConnectionError`` it is
  what any other lost connection is: retried by the driver on a new
  connection, or, for a script that is not safe to repeat, an unknown
  outcome.
* ``CPacking`` (``backends.redis.packing``): commands packed by hiredis, on
  pools whose text encoding is strict UTF-8.

A Redis Cluster client makes a pool per node from one set of node options,
into which its constructor puts the driver's class (TCP or TLS);
``use_backend_connections_on_cluster`` puts the backend's there instead,
before the first node connects. The backend's own pools on a Cluster
(``PrimaryConnections``) get it from ``use_backend_connections``.
"""

from __future__ import annotations

from typing import Any, cast

from redis import exceptions as rx
from redis.asyncio.connection import AbstractConnection

from backends.redis.packing import CPacking, packs_in_c


class ClosedTransport:
    """Mixed in before a redis-py connection class: a write to a closed transport
    is a ``ConnectionError`` (the driver has dropped the connection by then)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        connection = cast(Any, self)  # a redis-py connection (its API is untyped)
        if not connection.is_connected:  # as the driver's own send would, first
            await connection.connect_check_health(check_health=False)
        transport = connection._writer.transport
        try:
            await cast(Any, super()).send_packed_command(command, check_health)
        except RuntimeError as error:
            if not transport.is_closing():
                raise
            raise rx.ConnectionError(
                "the connection closed before the command was written"
            ) from error


_MADE: dict[tuple[type[AbstractConnection], bool], type[AbstractConnection]] = {}


def backend_connection_class(
    base: type[AbstractConnection], *, c_packing: bool
) -> type[AbstractConnection]:
    """``base`` with ``ClosedTransport`` and, if ``c_packing``, hiredis's packer
    (one subclass per combination; a class made here is returned as it is)."""
    if issubclass(base, ClosedTransport):
        return base
    made = _MADE.get((base, c_packing))
    if made is None:
        mixins: tuple[type, ...] = (ClosedTransport, CPacking) if c_packing else (ClosedTransport,)
        name = ("CPacked" if c_packing else "") + f"Guarded{base.__name__}"
        made = cast(type[AbstractConnection], type(name, (*mixins, base), {}))
        _MADE[(base, c_packing)] = made
    return made


def use_backend_connections(pool: Any) -> bool:
    """Give ``pool`` (a redis-py asyncio connection pool, before its first
    connection) the backend's connection class; True where it packs in C (its
    text encoding is strict UTF-8), False where the driver's packer stays."""
    c_packing = packs_in_c(pool.connection_kwargs)
    pool.connection_class = backend_connection_class(pool.connection_class, c_packing=c_packing)
    return c_packing


def use_backend_connections_on_cluster(cluster: Any) -> None:
    """Give a redis-py asyncio ``RedisCluster`` (made, not yet connected) the
    backend's connection class on every node pool it makes: the node options
    its nodes are made from, and the startup nodes already made from them."""
    manager = cluster.nodes_manager
    options = manager.connection_kwargs
    made = backend_connection_class(options["connection_class"], c_packing=packs_in_c(options))
    options["connection_class"] = made
    for node in manager.startup_nodes.values():
        node.connection_class = made
