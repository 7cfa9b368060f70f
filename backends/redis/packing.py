"""Commands put into RESP by hiredis's C packer.

redis-py's synchronous client packs with hiredis when it is installed; its
asyncio client always packs in Python, about 0.9 µs per argument. A fresh
commit sends four scripts of about 24 arguments each, so the Python packer
cost more per commit than the whole memory backend does (19 µs a script
against hiredis's 3.7 µs, measured on this project's own commands).

``CPacking`` is mixed into the connection classes of the backend's pools
(``backends.redis.connections``); its only change is ``pack_command``. The
bytes are the same as the driver's (a unit test checks them over every
argument type the driver accepts); a value hiredis does not take (a
bytearray or a memoryview, which the driver sends, and None, a bool or an
object, which it refuses with ``DataError``) is handed to the driver's own
packer. A pool that encodes text other than as strict UTF-8 (hiredis's only
encoding) keeps the driver's packer (``packs_in_c``).
"""

from __future__ import annotations

from typing import Any, cast

import hiredis
from redis.asyncio.connection import AbstractConnection

_UTF8 = ("utf-8", "utf8")


def packs_in_c(options: dict[str, Any]) -> bool:
    """Can a pool with these connection options pack in C (strict UTF-8 text)?"""
    encoding = str(options.get("encoding", "utf-8")).lower()
    return encoding in _UTF8 and options.get("encoding_errors", "strict") == "strict"


class CPacking:
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
