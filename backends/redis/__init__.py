"""The Redis backend: durable, shared, one atomic script per transition.

``open_redis_backend`` opens a deployment that ``initialise`` (``message-committer
migrate --backend redis``) created; it never initialises one itself. Modules:

* ``keys``: the key layout (documented there), shards and the id encoding;
* ``lua``: the scripts' calling convention (deployment identity, server time)
  and shared helpers;
* ``commits``: the commit transitions' scripts; ``members``: versioned
  membership; ``history``: history pages; ``recovery``: the recovery queue;
* ``codec``: the stored byte forms; ``link``: the connection (standalone,
  Sentinel or Cluster), round-trip counting and error translation;
* ``deployment``: the identity, the eviction check and the upgrade from
  release 1; ``store``: the MessageStore; ``outbox``: the per-shard streams;
* ``sizing``: measures a committed record's memory (``python -m
  backends.redis.sizing``);
* ``mailbox``, ``partitions``, ``delivery``: the delivery side (mailboxes,
  the outbox streams as leased relay partitions, the per-user conversation
  index, history records for the relay).

See ``docs/redis.md`` for durability, Sentinel and Cluster, and measured sizes.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from backends.redis import abandon, commits, delivery, history, members, recovery
from backends.redis.commits import CommitCalls
from backends.redis.delivery import open_delivery as delivery_side
from backends.redis.deployment import check_eviction, check_identity, read_deployment
from backends.redis.keys import KeySpace, check_prefix
from backends.redis.link import RedisLink, connect
from backends.redis.lua import Script
from backends.redis.members import RedisMembershipStore
from backends.redis.outbox import RedisOutbox
from backends.redis.replication import Replication
from backends.redis.store import RedisMessageStore
from service.domain.delivery import DeliverySettings
from service.domain.errors import StoreError, StoreSchemaError, StoreUnavailable, StoreWiped
from service.domain.ports import Backend, Clock, StoreSettings

__all__ = ["SCRIPTS", "open_link", "open_redis_backend"]

SCRIPTS: tuple[Script, ...] = (
    *commits.SCRIPTS,
    *members.SCRIPTS,
    *history.SCRIPTS,
    *recovery.SCRIPTS,
    *abandon.SCRIPTS,
    *delivery.SCRIPTS,
)


def open_link(
    url: str,
    *,
    socket_timeout_s: float = 2.0,
    connect_timeout_s: float = 1.0,
    max_connections: int = 128,
    share: bool = True,
) -> RedisLink:
    """A counted connection to ``url`` (nothing sent yet). ``share``: scripts without
    WAIT share one connection (False where replicas are waited for: see
    ``backends/redis/shared.py``)."""
    client, mode = connect(
        url,
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_connections=max_connections,
    )
    return RedisLink(client, Counter(), mode, share=share)


async def open_redis_backend(
    url: str,
    *,
    prefix: str = "mc",
    settings: StoreSettings | None = None,
    identity_form: Literal["digest", "whole"] = "digest",
    socket_timeout_s: float = 2.0,
    connect_timeout_s: float = 1.0,
    max_connections: int = 128,
    allow_eviction: bool = False,
    wait_replicas: int = 0,
    wait_timeout_ms: int = 1000,
    test_clock: Clock | None = None,
    delivery: DeliverySettings | None = None,
    deployment: str | None = None,
) -> Backend:
    """Connect, check the deployment identity and the eviction policy, load the scripts.

    Fails closed: StoreUnavailable when Redis does not answer (StoreMisconfigured
    for an evicting Redis, StoreWiped for lost data), StoreSchemaError for a
    prefix that was never initialised or holds another layout; no text names an
    address, password, key or script. ``test_clock`` (tests only) replaces
    Redis's TIME in every script, so a test can drive retention exactly; the
    service never passes one: a replica's clock never decides anything here.
    ``deployment``: the identity this service was told it serves; a prefix holding
    another one is refused (StoreWiped), None checks nothing (tests).
    """
    try:
        check_prefix(prefix)
    except ValueError as exc:
        raise StoreUnavailable(str(exc)) from None
    link = open_link(
        url,
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_connections=max_connections,
        share=wait_replicas == 0,
    )
    try:
        await link.call("PING", write=False)
        found = await read_deployment(link, prefix)
        if deployment is not None and found.identity != deployment:
            raise StoreWiped("redis: the prefix holds another deployment than the configured one")
        keys = KeySpace(prefix, found.shards)
        await check_identity(link, keys, found.identity)
        await check_eviction(link, allow=allow_eviction)
        await link.load_scripts(SCRIPTS)
    except StoreError as exc:
        await link.close()
        if isinstance(exc, StoreSchemaError | StoreUnavailable) and (
            isinstance(exc, StoreSchemaError) or exc.operator_hint
        ):
            raise
        raise StoreUnavailable(f"redis backend could not be opened: {exc}") from None
    calls = CommitCalls(link, keys, found.identity, test_clock)
    events: Counter[str] = Counter()
    try:
        replication = Replication(link, keys, wait_replicas, wait_timeout_ms)
        ports = await delivery_side(calls, delivery or DeliverySettings(), replication, events)
    except StoreError:
        await link.close()
        raise
    store = RedisMessageStore(
        calls,
        (settings or StoreSettings()).validate(),
        identity_form,
        allow_eviction,
        SCRIPTS,
        wait_replicas,
        wait_timeout_ms,
    )
    backend = Backend(
        name="redis",
        store=store,
        membership=RedisMembershipStore(calls, store.replication),
        outbox=RedisOutbox(link, keys),
        durable=True,
        requests=link.requests,
        delivery=ports,
        events=events,
    )
    backend.server_time = (
        (lambda: _clock_ms(test_clock)) if test_clock is not None else lambda: server_time_ms(link)
    )  # the clock the scripts decide by: a test's, else TIME
    backend.closers.append(link.close)
    return backend


async def _clock_ms(clock: Clock) -> int:
    return clock.now_ms()


async def server_time_ms(link: RedisLink) -> int:
    """Redis's ``TIME`` in epoch milliseconds (the clock every script decides by)."""
    reply = await link.call("TIME", write=False)
    if not isinstance(reply, list | tuple) or len(reply) != 2:
        raise StoreUnavailable("redis: TIME gave an unexpected reply")
    seconds, micros = (int(part) for part in reply)
    return seconds * 1000 + micros // 1000
