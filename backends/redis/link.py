"""The one connection of a Redis backend: topology, round trips, scripts, errors.

``MC_REDIS_URL`` picks the topology:

==============================================================  ============================
URL                                                             topology
==============================================================  ============================
``redis://[:password@]host:port/db`` (``rediss://`` for TLS)    one server (or a proxy)
``redis+sentinel://[:password@]h1:p1,h2:p2,h3:p3/<name>/<db>``  a master found through
(``rediss+sentinel://``)                                        Sentinel, followed on failover
``redis+cluster://[:password@]h1:p1,h2:p2/``                    a Redis Cluster
(``rediss+cluster://``)
==============================================================  ============================

Everything the store and the outbox send goes through ``RedisLink``, which

* counts each round trip in ``requests["redis_call"]``;
* runs scripts by EVALSHA and reloads one on NOSCRIPT (nothing ran: sent again);
  on one server or behind Sentinel, scripts share one connection (``shared.py``)
  unless the deployment waits for replicas; a round trip with WAIT, and every one
  where replicas are waited for, takes a pooled one (``exchange.py``);
* lets the driver send a command again after a failed or timed-out connection,
  except a script that is not repeatable (``Script.repeatable``: the relay's
  claim and settle): its reply may have been lost after it ran, so the caller
  gets an unknown outcome instead of a second run;
* sends the commands that concern every server (SCRIPT LOAD, SCRIPT EXISTS,
  INFO) to every primary of a Cluster;
* turns every driver exception into the store's own error family, with a
  text that names neither the server address, a password, a key nor a
  script. The driver's exception is deliberately not chained (``from
  None``): its text names the address. Only its class name is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

from redis import exceptions as rx
from redis.asyncio import BlockingConnectionPool, Redis, SSLConnection
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff

from backends.redis.connections import (
    use_backend_connections,
    use_backend_connections_on_cluster,
)
from backends.redis.exchange import Arg as Arg
from backends.redis.exchange import driver_traced, exchange
from backends.redis.lua import Script
from backends.redis.primaries import PrimaryConnections
from backends.redis.shared import SharedConnection
from service.domain.errors import (
    StoreCorrupt,
    StoreError,
    StoreInvalid,
    StoreOutcomeUnknown,
    StoreUnavailable,
    StoreWiped,
)

CALL = "redis_call"
CLOSE_DRAIN_S = 5.0  # how long close() lets round trips in flight end before letting go
_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


class LinkClosed(StoreUnavailable):
    """A round trip asked of a link already closed: refused before it could open a
    connection (one opened then would outlive the link, for the collector to find)."""


class WriteRefused(StoreUnavailable):
    """Redis refused a write before running it (out of memory, a read-only
    replica): nothing was written, reads may still work."""


T = TypeVar("T")
_SEND_ONCE: ContextVar[bool] = ContextVar("mc_redis_send_once", default=False)


class _Retry(Retry):
    """The driver's retry of a command whose connection failed or timed out, except
    inside ``_once``: such a failure may come after Redis ran the command (a reply
    lost or late), and a script that is not safe to repeat must not run twice; the
    caller gets the failure (an unknown outcome) instead."""

    def get_retries(self) -> int:  # a Cluster's own retry loop asks this
        return 0 if _SEND_ONCE.get() else super().get_retries()

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        if not _SEND_ONCE.get():
            return await super().call_with_retry(do, fail, is_retryable, with_failure_count)
        try:
            return await do()
        except self._supported_errors as error:  # the driver drops the connection here
            await (fail(error, 1) if with_failure_count else fail(error))
            raise


@contextlib.contextmanager
def _once(scripts: Sequence[Script]) -> Iterator[None]:
    """No resend by the driver while a script of ``scripts`` that is not repeatable runs."""
    token = _SEND_ONCE.set(True) if any(not s.repeatable for s in scripts) else None
    try:
        yield
    finally:
        if token is not None:
            _SEND_ONCE.reset(token)


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
        if text.startswith(_UNAVAILABLE_REPLIES) or text.startswith(("MOVED", "ASK")):
            return StoreUnavailable(f"redis is not serving requests ({kind})")
        if "script" in text.lower():
            return StoreCorrupt("redis could not process stored data")
        return StoreUnavailable(f"redis refused a command ({kind})")
    if isinstance(exc, rx.DataError):
        return StoreInvalid("a value could not be sent to redis")
    return StoreUnavailable(f"redis call failed ({kind})")


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed ``MC_REDIS_URL`` (never logged: it may hold a password)."""

    mode: str  # "single", "sentinel" or "cluster"
    url: str
    hosts: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    password: str | None = None
    username: str | None = None
    tls: bool = False


def parse_url(url: str) -> Address:
    """The topology of ``url``; StoreUnavailable naming only the rule broken."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise StoreUnavailable("the redis address is malformed") from None
    scheme = parts.scheme.lower()
    if scheme in ("redis", "rediss", "unix"):
        return Address("single", url)
    base, _, mode = scheme.partition("+")
    if base not in ("redis", "rediss") or mode not in ("sentinel", "cluster"):
        raise StoreUnavailable(
            "the redis address must use the scheme redis, rediss, redis+sentinel or redis+cluster"
        )
    netloc = parts.netloc.rpartition("@")
    credentials, hostlist = netloc[0], netloc[2]
    username, _, password = credentials.partition(":") if credentials else ("", "", "")
    hosts = []
    for item in filter(None, hostlist.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise StoreUnavailable("every redis host needs host:port")
        hosts.append((host.strip("[]"), int(port)))
    if not hosts:
        raise StoreUnavailable("the redis address names no host")
    path = [p for p in parts.path.split("/") if p]
    master, db = "", 0
    if mode == "sentinel":
        if not path:
            raise StoreUnavailable("a sentinel address needs /<master name>[/<db>]")
        master = unquote(path[0])
        if len(path) > 1:
            if not path[1].isdigit():
                raise StoreUnavailable("the redis database must be a number")
            db = int(path[1])
    return Address(
        mode,
        url,
        tuple(hosts),
        master,
        db,
        unquote(password) or None,
        unquote(username) or None,
        base == "rediss",
    )


def connect(
    url: str,
    *,
    socket_timeout_s: float,
    connect_timeout_s: float,
    max_connections: int,
) -> tuple[Any, str]:
    """A client for ``url`` and its mode; StoreUnavailable for a malformed address."""
    address = parse_url(url)
    retry = _Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2)
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
        "retry": retry,
        "decode_responses": False,
    }
    try:
        if address.mode == "single":
            pool = BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=connect_timeout_s + socket_timeout_s,
                **common,
            )
            use_backend_connections(pool)
            return Redis.from_pool(pool), "single"
        auth: dict[str, Any] = {
            "password": address.password,
            "username": address.username,
            "ssl": address.tls,
        }
        if address.mode == "sentinel":
            make_sentinel = cast(Callable[..., Any], Sentinel)
            sentinel = make_sentinel(list(address.hosts), sentinel_kwargs=dict(common), **common)
            client = sentinel.master_for(
                address.master, db=address.db, max_connections=max_connections, **auth, **common
            )
            use_backend_connections(client.connection_pool)
            client.mc_sentinels = list(sentinel.sentinels)  # closed with the link
            return client, "sentinel"
        nodes = [ClusterNode(host, port) for host, port in address.hosts]
        make_cluster = cast(Callable[..., Any], RedisCluster)
        cluster = make_cluster(
            startup_nodes=nodes, max_connections=max_connections, **auth, **common
        )
        use_backend_connections_on_cluster(cluster)
        # for WAIT, which must share a connection with the write (primaries.py)
        cluster.mc_node_options = {
            **{k: v for k, v in auth.items() if k != "ssl"},
            **({"connection_class": SSLConnection} if address.tls else {}),
            **common,
            "max_connections": max(4, max_connections // 4),
            "timeout": connect_timeout_s + socket_timeout_s,
        }
        return cluster, "cluster"
    except (ValueError, TypeError, rx.RedisError):
        raise StoreUnavailable("the redis address is malformed") from None


class RedisLink:
    """A Redis client (any topology) plus the backend's round-trip counter."""

    def __init__(
        self, client: Any, requests: Counter[str], mode: str = "single", *, share: bool = True
    ) -> None:
        self.client = client
        self.requests = requests
        self.mode = mode
        self.cluster = mode == "cluster"
        self._send = cast(Callable[..., Awaitable[Any]], client.execute_command)
        self._closed = False
        self._primaries = (
            PrimaryConnections(client, client.mc_node_options) if self.cluster else None
        )
        self._pool: Any = None if self.cluster else getattr(client, "connection_pool", None)
        self._shared = SharedConnection(self._pool) if self._pool is not None and share else None
        self._in_flight = 0  # round trips under way, for close()
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        if self._closed:  # a call after close() would open a connection nothing closes
            raise LinkClosed("the Redis link is closed")
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _execute(self, *args: Arg) -> Any:
        with self._busy():
            return await self._send(*args)

    @property
    def shares_connection(self) -> bool:
        """Whether scripts without WAIT share one connection (``shared.py``)."""
        return self._shared is not None

    def _lean_pool(self) -> Any:
        """The pool scripts are exchanged on directly (``exchange``): one server or
        Sentinel while redis-py is not traced (the tracing patches the driver's
        command and pipeline calls); else None, and the driver's calls are used."""
        if self._pool is None or driver_traced():
            return None
        return self._pool

    async def _scripts(
        self, commands: Sequence[Sequence[Arg]], key: str | None = None
    ) -> list[Any]:
        """EVALSHA commands (with INCR and WAIT: replies the driver does not convert)
        in one round trip, on one connection. Without a lean pool: a command alone
        by the driver's client, several by its pipeline, or with ``key`` on one
        connection to ``key``'s primary (a Cluster)."""
        pool = self._lean_pool()
        if pool is not None:
            with self._busy():
                if self._shared is not None and not any(c[0] == "WAIT" for c in commands):
                    return await self._shared.exchange(commands)
                return await exchange(pool, commands)
        if key is not None:
            return await self._same_connection(key, commands)
        if len(commands) == 1:
            return [await self._execute(*commands[0])]
        return await self._pipeline(commands)

    async def _same_connection(self, key: str, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """``commands`` pipelined on ONE connection (a Cluster: to ``key``'s primary)."""
        if self._primaries is not None:
            with self._busy():
                return await self._primaries.pipelined(key, commands)
        return await self._pipeline(commands)

    async def call(self, *args: Arg, write: bool) -> Any:
        """One command, one round trip."""
        self.requests[CALL] += 1
        try:
            return await self._execute(*args)
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None

    async def every_primary(self, *args: Arg) -> list[Any]:
        """A command for every server (a Cluster's primaries; else the one server):
        ``SCRIPT LOAD``, ``SCRIPT EXISTS`` (answers merged: loaded everywhere) or
        ``INFO section`` (one answer per server)."""
        self.requests[CALL] += 1
        try:
            if not self.cluster:
                return [await self._execute(*args)]
            command = " ".join(str(a) for a in args[:2]).upper()
            with self._busy():
                if command == "SCRIPT LOAD":
                    replies = await self.client.script_load(args[2])
                elif command == "SCRIPT EXISTS":
                    return [await self.client.script_exists(*args[2:])]
                elif args and str(args[0]).upper() == "INFO":
                    replies = await self.client.info(*args[1:], target_nodes=RedisCluster.PRIMARIES)
                else:
                    raise StoreInvalid("this command is not sent to every server")
        except rx.RedisError as exc:
            raise translate(exc, write=False) from None
        return list(replies.values()) if isinstance(replies, dict) else [replies]

    async def pipeline(self, commands: Sequence[Sequence[Arg]], *, write: bool) -> list[Any]:
        """Several commands in one round trip per server (not a transaction)."""
        self.requests[CALL] += 1
        try:
            return await self._pipeline(commands)
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None

    async def script(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], *, write: bool = True
    ) -> Any:
        """EVALSHA ``script``; on NOSCRIPT load it once and call again. A
        ``{"wiped"}`` reply raises StoreWiped."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        self.requests[CALL] += 1
        try:
            try:
                with _once([script]):
                    [reply] = await self._scripts([command])
            except rx.NoScriptError:
                self.requests[CALL] += 2
                await self.every_primary("SCRIPT", "LOAD", script.source)
                with _once([script]):
                    [reply] = await self._scripts([command])
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None
        if isinstance(reply, list) and reply and reply[0] == b"wiped":
            raise StoreWiped("redis: this shard does not hold the deployment's data")
        return reply

    async def scripts(
        self, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Arg]]], *, write: bool
    ) -> list[Any]:
        """EVALSHA ``script`` once per (keys, args), pipelined: one round trip per
        server. On NOSCRIPT the script is loaded and the whole pipeline sent again
        (NOSCRIPT: none of them ran). Replies in order; a
        ``{"wiped"}`` reply raises StoreWiped."""
        commands = [("EVALSHA", script.sha, len(k), *k, *a) for k, a in calls]
        self.requests[CALL] += 1
        try:
            try:
                with _once([script]):
                    replies = await self._scripts(commands)
            except rx.NoScriptError:
                self.requests[CALL] += 2
                await self.every_primary("SCRIPT", "LOAD", script.source)
                with _once([script]):
                    replies = await self._scripts(commands)
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None
        for reply in replies:
            if isinstance(reply, list) and reply and reply[0] == b"wiped":
                raise StoreWiped("redis: this shard does not hold the deployment's data")
        return replies

    async def _pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        with self._busy():
            async with self.client.pipeline(transaction=False) as pipe:
                for command in commands:
                    cast(Callable[..., object], pipe.execute_command)(*command)
                return list(await pipe.execute())

    async def script_and_wait(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        replicas: int,
        wait_ms: int,
        *,
        barrier: str | None = None,
        write: bool | None = None,
    ) -> tuple[Any, int]:
        """EVALSHA then WAIT on the same connection, in one round trip: the reply and
        how many replicas acknowledged the script's writes (and everything before
        them in the replication stream). With ``barrier`` (a key of the script's
        shard) an INCR of it goes between them, for a script whose answer may rest
        on what it read: replicas that acknowledge it hold everything the script
        read, on the server that answered it. Errors are translated as a write's
        (outcome unknown) unless ``write`` is False; ``write`` None: a write
        without ``barrier``, a read with it (History)."""
        commands: list[Sequence[Arg]] = [("EVALSHA", script.sha, len(keys), *keys, *args)]
        if barrier is not None:
            commands.append(("INCR", barrier))
        commands.append(("WAIT", replicas, wait_ms))
        for attempt in range(2):
            self.requests[CALL] += 1
            try:
                with _once([script]):
                    replies = await self._scripts(commands, keys[0])
            except rx.NoScriptError:
                if attempt:
                    raise StoreUnavailable("redis lost the backend's scripts") from None
                await self.load_scripts([script])
                continue
            except rx.RedisError as exc:
                raise translate(exc, write=barrier is None if write is None else write) from None
            reply, acked = replies[0], replies[-1]
            if isinstance(reply, list) and reply and reply[0] == b"wiped":
                raise StoreWiped("redis: this shard does not hold the deployment's data")
            return reply, int(acked)
        raise AssertionError("unreachable")  # pragma: no cover

    async def script_pipeline(
        self,
        calls: Sequence[tuple[Script, Sequence[str], Sequence[Arg]]],
        wait: tuple[int, int] | None = None,
    ) -> tuple[list[Any], int]:
        """Several scripts (EVALSHA each), pipelined on one connection: one round
        trip. Each runs on its own, in order; a refused one does not stop the
        next (each checks its own precondition). ``wait`` (replicas, ms) adds
        WAIT at the end: the second value is how many replicas acknowledged
        (0 without). On NOSCRIPT the scripts are loaded and the pipeline sent
        once more (NOSCRIPT: none of them ran)."""
        commands: list[Sequence[Arg]] = [
            ("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls
        ]
        if wait is not None:
            commands.append(("WAIT", *wait))
        key = str(calls[0][1][0])
        for attempt in range(2):
            self.requests[CALL] += 1
            try:
                with _once([s for s, _, _ in calls]):
                    replies = await self._scripts(commands, key)
            except rx.NoScriptError:
                if attempt:
                    raise StoreUnavailable("redis lost the backend's scripts") from None
                await self.load_scripts(list({s.sha: s for s, _, _ in calls}.values()))
                continue
            except rx.RedisError as exc:
                raise translate(exc, write=True) from None
            for reply in replies:
                if isinstance(reply, list) and reply and reply[0] == b"wiped":
                    raise StoreWiped("redis: this shard does not hold the deployment's data")
            if wait is None:
                return replies, 0
            return replies[:-1], int(replies[-1])
        raise AssertionError("unreachable")  # pragma: no cover

    async def replication_barrier(self, key: str, replicas: int, wait_ms: int) -> int:
        """A one-key write then WAIT on the same connection: when enough replicas
        acknowledge it, they hold everything written before it too. Returns the count."""
        _, acked = await self.reads_and_wait([], key, replicas, wait_ms, write=True)
        return acked

    async def reads_and_wait(
        self,
        commands: Sequence[Sequence[Arg]],
        barrier: str,
        replicas: int,
        wait_ms: int,
        *,
        write: bool = False,
    ) -> tuple[list[Any], int]:
        """``commands`` (keys of ``barrier``'s shard only), an INCR of ``barrier`` and
        WAIT, pipelined on ONE connection: one round trip. The replies of
        ``commands`` and how many replicas acknowledged the barrier, so hold what
        the commands read on the server that answered them."""
        self.requests[CALL] += 1
        try:
            replies = await self._same_connection(
                barrier, [*commands, ("INCR", barrier), ("WAIT", replicas, wait_ms)]
            )
        except rx.RedisError as exc:
            raise translate(exc, write=write) from None
        return replies[:-2], int(replies[-1])

    async def load_scripts(self, scripts: Sequence[Script]) -> None:
        """SCRIPT LOAD every script on every server; fail if one is refused."""
        for script in scripts:
            for reply in await self.every_primary("SCRIPT", "LOAD", script.source):
                if _text(reply) != script.sha:
                    raise StoreUnavailable("redis did not accept the backend's scripts")

    async def scripts_ready(self, scripts: Sequence[Script]) -> None:
        """SCRIPT EXISTS on every server; reload what is missing."""
        replies = await self.every_primary("SCRIPT", "EXISTS", *(s.sha for s in scripts))
        exists = replies[0] if replies and isinstance(replies[0], list) else replies
        if not isinstance(exists, list) or len(exists) != len(scripts):
            raise StoreUnavailable("redis gave an unexpected readiness reply")
        missing = [s for s, known in zip(scripts, exists, strict=True) if not known]
        if missing:
            await self.load_scripts(missing)

    async def close(self) -> None:
        """Let go of every connection: the client's, the Sentinels' and a Cluster's
        primaries'. A round trip in flight may be opening a connection (through
        Sentinel it asks a Sentinel first) that a release cannot see yet; it is let
        end (at most CLOSE_DRAIN_S) and everything is released once more, so no
        connection outlives the link for the garbage collector to find."""
        if self._closed:
            return
        self._closed = True
        await self._release()
        if self._in_flight:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_DRAIN_S):
                    await self._idle.wait()
            await self._release()

    async def _release(self) -> None:
        if self._shared is not None:
            await self._shared.close()
        if self._primaries is not None:
            await self._primaries.close()
        with contextlib.suppress(rx.RedisError, OSError):  # broken: nothing to release
            if self.cluster:
                await self.client.aclose()
            else:
                await self.client.aclose(close_connection_pool=True)
        # each Sentinel's client on its own: one that fails to close must not leave
        # the others' sockets to the garbage collector
        for sentinel in getattr(self.client, "mc_sentinels", ()):
            with contextlib.suppress(rx.RedisError, OSError):
                await sentinel.aclose(close_connection_pool=True)


def _text(reply: object) -> str:
    if isinstance(reply, bytes):
        return reply.decode("ascii", "replace")
    return str(reply)
