"""The Redis backend: durable, shared, one atomic script per transition.

``open_redis_backend`` is the only entry point. Modules:

* ``keys``: the key layout (documented there) and the id encoding;
* ``codec``: the stored byte forms (commit hash full and compact forms,
  records, delivery);
* ``scripts``: the Lua scripts, one per transition;
* ``link``: the connection, round-trip counting and error translation;
* ``store``: MessageStore + MembershipStore; ``outbox``: the Stream outbox;
* ``sizing``: measures a committed record's memory (``python -m
  backends.redis.sizing``).

See ``docs/redis.md`` for durability, cluster notes and measured sizes.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from backends.redis import scripts
from backends.redis.keys import SCHEMA_VERSION, KeySpace
from backends.redis.link import RedisLink, connect
from backends.redis.outbox import RedisOutbox
from backends.redis.store import RedisMessageStore
from service.domain.errors import StoreError, StoreSchemaError, StoreUnavailable
from service.domain.ports import Backend, Clock, StoreSettings, SystemClock

__all__ = ["open_redis_backend"]


async def open_redis_backend(
    url: str,
    *,
    prefix: str = "mc",
    settings: StoreSettings | None = None,
    clock: Clock | None = None,
    identity_form: Literal["digest", "whole"] = "digest",
    socket_timeout_s: float = 2.0,
    connect_timeout_s: float = 1.0,
    max_connections: int = 128,
) -> Backend:
    """Connect, PING, check the layout version and load the scripts.

    Fails closed: any failure raises ``StoreUnavailable`` (or
    ``StoreSchemaError`` for data written by another layout version) whose
    text names no address, password, key or script.
    """
    try:
        keys = KeySpace(prefix)
    except ValueError as exc:
        raise StoreUnavailable(str(exc)) from None
    requests: Counter[str] = Counter()
    link = RedisLink(
        connect(
            url,
            socket_timeout_s=socket_timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
        ),
        requests,
    )
    try:
        await _bootstrap(link, keys)
    except StoreError as exc:
        await link.close()
        if isinstance(exc, StoreSchemaError):
            raise
        raise StoreUnavailable(f"redis backend could not be opened: {exc}") from None
    store = RedisMessageStore(
        link, keys, settings or StoreSettings(), clock or SystemClock(), identity_form
    )
    backend = Backend(
        name="redis",
        store=store,
        membership=store,
        outbox=RedisOutbox(link, keys),
        durable=True,
        requests=requests,
    )
    backend.closers.append(link.close)
    return backend


async def _bootstrap(link: RedisLink, keys: KeySpace) -> None:
    replies = await link.pipeline(
        [("PING",), ("SET", keys.schema, SCHEMA_VERSION, "NX"), ("GET", keys.schema)],
        write=False,  # setting the version if absent is idempotent
    )
    if replies[0] is not True:
        raise StoreUnavailable("redis did not answer PING")
    if replies[2] != SCHEMA_VERSION.encode():
        raise StoreSchemaError("the redis data was written by another layout version")
    await link.load_scripts(scripts.ALL)
