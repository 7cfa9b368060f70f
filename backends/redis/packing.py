"""Commands put into RESP by hiredis's C packer.

redis-py's synchronous client packs with hiredis when it is installed; its
asyncio client always packs in Python, about 0.9 µs per argument. A fresh
commit sends four scripts of about 24 arguments each, so the Python packer
cost more per commit than the whole memory backend does (19 µs a script
against hiredis's 3.7 µs, measured on this project's own commands).

``use_c_packer(pool)`` gives a connection pool a subclass of the connection
class it already chose (TCP, TLS, Unix socket, Sentinel-managed), whose only
change is ``pack_command``. The bytes are the same as the driver's (a unit
test checks them over every argument type the driver accepts); a value
hiredis does not take (a bytearray or a memoryview, which the driver sends,
and None, a bool or an object, which it refuses with ``DataError``) is handed
to the driver's own packer. A pool that
encodes text other than as strict UTF-8 (hiredis's only encoding) keeps the
driver's packer.
"""

from __future__ import annotations

from typing import Any, cast

import hiredis
from redis.asyncio.connection import AbstractConnection

_UTF8 = ("utf-8", "utf8")


class _CPacking:
    """Mixed in before a redis-py connection class: ``pack_command`` by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):  # "CONFIG GET" is two words on the wire
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(cast(Any, args))]
        except TypeError:  # a bytearray or memoryview, or None, a bool, an object:
            # the driver's own packer sends the first and refuses the others
            return cast(AbstractConnection, super()).pack_command(*args)


_MADE: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def c_packed(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` with hiredis's packer (one subclass per class)."""
    if issubclass(connection_class, _CPacking):
        return connection_class
    made = _MADE.get(connection_class)
    if made is None:
        name = f"CPacked{connection_class.__name__}"
        made = cast(type[AbstractConnection], type(name, (_CPacking, connection_class), {}))
        _MADE[connection_class] = made
    return made


def use_c_packer(pool: Any) -> bool:
    """Give ``pool`` (a redis-py asyncio connection pool, before its first
    connection) hiredis's packer; False where its text encoding is not strict
    UTF-8 and the driver's packer stays."""
    options = pool.connection_kwargs
    encoding = str(options.get("encoding", "utf-8")).lower()
    if encoding not in _UTF8 or options.get("encoding_errors", "strict") != "strict":
        return False
    pool.connection_class = c_packed(pool.connection_class)
    return True
