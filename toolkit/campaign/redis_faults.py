"""Bad days of a real Redis, for the fault campaign: eviction and lost identity.

``evicting(True)`` switches the server's ``maxmemory-policy`` to
``allkeys-lru`` (and back to what it was); ``identity_lost(True)`` hides one
shard's deployment marker (RENAME, so nothing is really lost) as a FLUSHALL
or an empty replica would. Readiness must refuse in both cases.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from service.domain.ports import Backend


class RedisFaults:
    def __init__(self, url: str, backend: Backend) -> None:
        self._url = url
        self._backend = backend
        self._policy: Any = None
        self._hidden: tuple[str, str] | None = None

    def _marker(self) -> str:
        keys = getattr(self._backend.store, "_keys", None)
        if keys is None:
            raise RuntimeError("not a Redis backend")
        marker: str = keys.shard(0).identity
        return marker

    async def evicting(self, on: bool) -> None:
        async with Redis.from_url(self._url) as client:
            if on:
                self._policy = (await client.config_get("maxmemory-policy"))["maxmemory-policy"]
                await client.config_set("maxmemory-policy", "allkeys-lru")
            elif self._policy is not None:
                await client.config_set("maxmemory-policy", self._policy)
                self._policy = None

    async def identity_lost(self, on: bool) -> None:
        async with Redis.from_url(self._url) as client:
            if on:
                marker = self._marker()
                self._hidden = (marker, marker + ":hidden-by-campaign")
                await client.rename(*self._hidden)
            elif self._hidden is not None:
                await client.rename(self._hidden[1], self._hidden[0])
                self._hidden = None
