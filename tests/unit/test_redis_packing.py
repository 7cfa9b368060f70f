"""hiredis's packer gives the bytes redis-py's own packer gives, keeps its errors,
and is put on every pool the backend opens, whatever the connection class, with
the closed-transport guard (``backends.redis.connections``)."""

from __future__ import annotations

from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio import BlockingConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.sentinel import SentinelManagedConnection

from backends.redis.connections import (
    ClosedTransport,
    backend_connection_class,
    use_backend_connections,
)
from backends.redis.link import connect


def c_packed(base: type[AbstractConnection]) -> type[AbstractConnection]:
    return backend_connection_class(base, c_packing=True)


COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 3, "mc:{7}:c:t:conv", "mc:{7}:m:t:conv", "mc:id", "dep", 0, -3),
    ("SET", "k", b"\x00\xff\r\n", bytearray(b"ab"), memoryview(b"cd")),
    ("SET", "k", "é, 中文 and 🎉", 1.5, 0.1, 1e20, -0.0, 10**30),
    ("CLIENT SETINFO", "LIB-NAME", "x"),  # two words in one argument
    (b"CONFIG GET", b"maxmemory"),
    ("XADD", "stream", "*", "f", "x" * 70_000),  # above the driver's chunking cutoff
    ("PING",),
]


def _wire(chunks: list[Any]) -> bytes:
    return b"".join(bytes(chunk) for chunk in chunks)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_the_bytes_are_the_drivers_own(command: tuple[Any, ...]) -> None:
    driver, packed = Connection(), c_packed(Connection)()
    assert _wire(packed.pack_command(*command)) == _wire(driver.pack_command(*command))
    pipeline = [command, ("PING",), command]
    assert _wire(packed.pack_commands(pipeline)) == _wire(driver.pack_commands(pipeline))


@pytest.mark.parametrize("value", [None, True, object()], ids=["none", "bool", "object"])
def test_a_value_redis_cannot_take_is_the_drivers_data_error(value: object) -> None:
    with pytest.raises(rx.DataError):
        c_packed(Connection)().pack_command("SET", "k", value)  # type: ignore[arg-type]


def test_text_that_is_not_utf8_is_refused_as_by_the_driver() -> None:
    with pytest.raises(UnicodeEncodeError):
        c_packed(Connection)().pack_command("SET", "k", "\ud800")


def test_the_connection_class_is_kept_and_made_once() -> None:
    classes: list[type[AbstractConnection]] = [
        Connection,
        SSLConnection,
        UnixDomainSocketConnection,
        SentinelManagedConnection,
    ]
    for cls in classes:
        packed = c_packed(cls)
        assert issubclass(packed, cls) and packed is not cls
        assert issubclass(packed, ClosedTransport)
        assert c_packed(cls) is packed and c_packed(packed) is packed
        guarded = backend_connection_class(cls, c_packing=False)
        assert issubclass(guarded, cls) and issubclass(guarded, ClosedTransport)
        assert guarded.pack_command is cls.pack_command  # the driver's packer


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://127.0.0.1:1/0", Connection),
        ("rediss://127.0.0.1:1/0", SSLConnection),
        ("unix:///tmp/nowhere.sock", UnixDomainSocketConnection),
    ],
)
def test_a_pool_keeps_its_schemes_connection_class(url: str, base: type) -> None:
    pool = BlockingConnectionPool.from_url(url)
    assert use_backend_connections(pool)
    assert issubclass(pool.connection_class, base)
    assert pool.connection_class.__name__ == f"CPackedGuarded{base.__name__}"


def test_a_pool_that_encodes_text_otherwise_keeps_the_drivers_packer() -> None:
    pool = BlockingConnectionPool.from_url("redis://127.0.0.1:1/0", encoding="latin-1")
    assert not use_backend_connections(pool)
    assert pool.connection_class is backend_connection_class(Connection, c_packing=False)
    assert pool.connection_class.pack_command is Connection.pack_command


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/main/0"],
)
def test_the_backends_client_packs_in_c_and_guards_its_writes(url: str) -> None:
    client, _ = connect(url, socket_timeout_s=1, connect_timeout_s=1, max_connections=2)
    assert client.connection_pool.connection_class.__name__.startswith("CPackedGuarded")
    assert issubclass(client.connection_pool.connection_class, ClosedTransport)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis+cluster://127.0.0.1:1,127.0.0.1:2/", Connection),
        ("rediss+cluster://127.0.0.1:1/", SSLConnection),
    ],
)
def test_a_clusters_own_node_pools_get_the_backends_class(url: str, base: type) -> None:
    """Every node pool a Cluster client makes, now (its startup nodes) and later
    (from its node options, on discovery or a redirect), packs in C and guards
    its writes (nothing connects here)."""
    cluster, mode = connect(url, socket_timeout_s=1, connect_timeout_s=1, max_connections=2)
    assert mode == "cluster"
    manager = cluster.nodes_manager
    made = manager.connection_kwargs["connection_class"]
    assert made is backend_connection_class(base, c_packing=True)
    assert issubclass(made, ClosedTransport) and issubclass(made, base)
    assert [node.connection_class for node in manager.startup_nodes.values()] == [made] * len(
        manager.startup_nodes
    )
    assert len(manager.startup_nodes) == url.count(",") + 1
