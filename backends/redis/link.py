"""The one connection of a Redis backend: round-trip counting, scripts, errors.

Everything the store and the outbox send goes through ``RedisLink``, which

* counts each round trip in ``requests["redis_call"]``;
* runs scripts by EVALSHA and reloads one on NOSCRIPT;
* turns every driver exception into the store's own error family, with a
  text that names neither the server address, a password, a key nor a
  script. The driver's exception is deliberately not chained (``from
  None``): its text names the address. Only its class name is kept.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from redis import exceptions as rx
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from backends.redis.scripts import Script
from service.domain.errors import (
    StoreCorrupt,
    StoreError,
    StoreInvalid,
    StoreOutcomeUnknown,
    StoreUnavailable,
)

Arg = str | bytes | int
CALL = "redis_call"
_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


class WriteRefused(StoreUnavailable):
    """Redis refused a write before running it (out of memory, a read-only
    replica): nothing was written, reads may still work."""


def translate(exc: BaseException, *, write: bool) -> StoreError:
    """The store error for a driver exception; its text carries no secrets."""
    kind = type(exc).__name__
    if isinstance(exc, rx.ConnectionError | rx.TimeoutError):
        if write:
            return StoreOutcomeUnknown(f"redis did not confirm a write ({kind})")
        return StoreUnavailable(f"redis did not answer ({kind})")
    if isinstance(exc, rx.OutOfMemoryError | rx.ReadOnlyError):
        return WriteRefused(f"redis refused a write ({kind})")
    if isinstance(exc, rx.ResponseError):
        text = str(exc)
        if text.startswith("WRONGTYPE"):
            return StoreCorrupt("a stored value has an unexpected type")
        if text.startswith(_UNAVAILABLE_REPLIES):
            return StoreUnavailable(f"redis is not serving requests ({kind})")
        if "script" in text.lower():
            return StoreCorrupt("redis could not process stored data")
        return StoreUnavailable(f"redis refused a command ({kind})")
    if isinstance(exc, rx.DataError):
        return StoreInvalid("a value could not be sent to redis")
    return StoreUnavailable(f"redis call failed ({kind})")


def connect(
    url: str,
    *,
    socket_timeout_s: float,
    connect_timeout_s: float,
    max_connections: int,
) -> Redis:
    """A client for ``url``; raises StoreUnavailable for a malformed address."""
    try:
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=connect_timeout_s + socket_timeout_s,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
            decode_responses=False,
        )
    except (ValueError, TypeError, rx.RedisError):
        raise StoreUnavailable("the redis address is malformed") from None
    return Redis.from_pool(pool)


class RedisLink:
    """A Redis client plus the backend's round-trip counter."""

    def __init__(self, client: Redis, requests: Counter[str]) -> None:
        self.client = client
        self.requests = requests
        self._execute = cast(Callable[..., Awaitable[Any]], client.execute_command)
        self._closed = False

    async def call(self, *args: Arg, write: bool) -> Any:
        """One command, one round trip."""
        self.requests[CALL] += 1
        try:
            return await self._execute(*args)
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None

    async def pipeline(self, commands: Sequence[Sequence[Arg]], *, write: bool) -> list[Any]:
        """Several commands in one round trip (not a transaction)."""
        self.requests[CALL] += 1
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for command in commands:
                    cast(Callable[..., object], pipe.execute_command)(*command)
                return list(await pipe.execute())
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None

    async def script(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], *, write: bool = True
    ) -> Any:
        """EVALSHA ``script``; on NOSCRIPT load it once and call again."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        self.requests[CALL] += 1
        try:
            try:
                return await self._execute(*command)
            except rx.NoScriptError:
                self.requests[CALL] += 2
                await self._execute("SCRIPT", "LOAD", script.source)
                return await self._execute(*command)
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None

    async def load_scripts(self, scripts: Sequence[Script]) -> None:
        """SCRIPT LOAD every script (one round trip); fail if one is refused."""
        replies = await self.pipeline([("SCRIPT", "LOAD", s.source) for s in scripts], write=True)
        for script, reply in zip(scripts, replies, strict=True):
            if _text(reply) != script.sha:
                raise StoreUnavailable("redis did not accept the backend's scripts")

    async def scripts_ready(self, scripts: Sequence[Script]) -> None:
        """PING and SCRIPT EXISTS in one round trip; reload what is missing."""
        replies = await self.pipeline(
            [("PING",), ("SCRIPT", "EXISTS", *(s.sha for s in scripts))], write=False
        )
        exists = replies[1]
        if not isinstance(exists, list) or len(exists) != len(scripts):
            raise StoreUnavailable("redis gave an unexpected readiness reply")
        missing = [s for s, known in zip(scripts, exists, strict=True) if not known]
        if missing:
            await self.load_scripts(missing)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(rx.RedisError):  # a broken connection: nothing to release
            await self.client.aclose(close_connection_pool=True)


def _text(reply: object) -> str:
    if isinstance(reply, bytes):
        return reply.decode("ascii", "replace")
    return str(reply)
