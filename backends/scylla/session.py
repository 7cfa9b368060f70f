"""The driver boundary: one connected session, asyncio-friendly, counted, translated.

Everything the Scylla backend sends goes through ``CqlSession``:

* the driver's sockets are served by the caller's own asyncio loop
  (``reactor.py``: no I/O thread, no GIL hand-off per response); prepared
  statements and batches go straight onto a pooled connection
  (``direct.py``), anything else through a ``ResponseFuture`` that resolves
  an asyncio future through module-level callbacks; either way a
  ``loop.call_later`` timer with the request timeout bounds every await;
  frames are not compressed;
* statements are prepared once per session, by name;
* every request is counted in ``requests``, and the driver never re-sends one
  on its own (``FallthroughRetryPolicy``), so the count is what goes on the
  wire: ``"lwt"`` per conditional statement or conditional batch,
  ``"statement"`` per plain one and ``"serial_read"`` per read at SERIAL /
  LOCAL_SERIAL (a Paxos round, but not a conditional write);
* driver exceptions become ``StoreError``s here and nowhere else. Texts name
  the kind of failure and the driver's exception class, never a host, a
  credential, a table or CQL; causes are dropped (``from None``) because the
  driver's own texts carry host addresses.

Consistency (DESIGN §8, docs/scylla.md): plain reads and writes use
``consistency`` (default LOCAL_QUORUM); conditional writes use
``serial_consistency`` (default SERIAL) for their Paxos phase and
``consistency`` for their commit; re-reads after a refused or unknown
conditional write use ``serial_consistency``.

Node routes (``node_routes``, for fault-injection proxies such as Toxiproxy):
the driver learns every node's address *and port* from ``system.peers_v2``, and
its ``AddressTranslator`` can only rewrite the address, so a translator alone
would still dial each node's own port. ``RoutedEndPointFactory`` instead makes
the endpoint of each mapped node its route (host, port); contact points are
mapped the same way, and Scylla's shard-aware port is not used (it would go
around the route).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import events
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from cassandra import (
    AuthenticationFailed,
    ConsistencyLevel,
    DriverException,
    OperationTimedOut,
    RequestValidationException,
    Unauthorized,
    WriteFailure,
    WriteTimeout,
)
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
    ShardAwareOptions,
)
from cassandra.connection import ConnectionException, DefaultEndPoint, EndPointFactory
from cassandra.metadata import _NodeInfo
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    FallthroughRetryPolicy,
    TokenAwarePolicy,
)
from cassandra.protocol import ErrorMessage
from cassandra.query import (
    PreparedStatement,
    SimpleStatement,
    dict_factory,
)

from backends.scylla import send_path as paths
from backends.scylla.borrow import OffLoop, streams_free
from backends.scylla.direct import PROTOCOL_VERSION, Call, DirectSender
from backends.scylla.reactor import loop_connection_class
from backends.scylla.send_path import BUILT_FOR, PathMismatch, SendPath
from backends.scylla.tls import ClusterTls
from service.domain.errors import (
    StoreError,
    StoreInvalid,
    StoreMisconfigured,
    StoreOutcomeUnknown,
    StoreSchemaError,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

Row = dict[str, Any]
Params = Sequence[object]
Send = Callable[[], Awaitable[list[Row]]]
Mode = Literal["read", "serial", "write", "cas"]
NodeRoutes = Mapping[str, tuple[str, int]]
"""``{node address: (host, port) to dial instead}``."""
Interceptor = Callable[[str, Send], Awaitable[list[Row]]]
"""``(statement name, send) -> rows``: tests wrap a send to inject failures; a
driver exception raised by the interceptor is translated like a real one.
Batches are named ``batch:<first statement>``."""

CONSISTENCY_LEVELS = (
    "ONE",
    "TWO",
    "THREE",
    "QUORUM",
    "ALL",
    "LOCAL_QUORUM",
    "EACH_QUORUM",
    "LOCAL_ONE",
)
SERIAL_LEVELS = ("SERIAL", "LOCAL_SERIAL")
DRIVER_ERRORS = (DriverException, NoHostAvailable, ConnectionException, ErrorMessage, OSError)
"""What the driver raises: its own exceptions are not all DriverExceptions, and with
no retry policy of its own a server error (overloaded, bootstrapping, a server
error) arrives as the protocol's ErrorMessage itself."""

RECONNECT_MAX_DELAY_S = 10.0
"""Longest pause between reconnection attempts to a node that went away."""


def consistency_level(name: str, allowed: Sequence[str]) -> int:
    """The driver's value for a level name (case-insensitive), or StoreInvalid."""
    upper = name.strip().upper()
    if upper not in allowed:
        raise StoreInvalid(f"consistency level must be one of {', '.join(allowed)}")
    return int(ConsistencyLevel.name_to_value[upper])


class RoutedEndPointFactory(EndPointFactory):  # type: ignore[misc]
    """Endpoints of discovered nodes: a mapped node's route, else its own address and
    port (as the driver's DefaultEndPointFactory makes them)."""

    def __init__(self, routes: NodeRoutes, port: int) -> None:
        self._routes = dict(routes)
        self._port = port

    def create(self, row: Mapping[str, Any]) -> Any:
        address = _NodeInfo.get_broadcast_rpc_address(row)
        if address in self._routes:
            return DefaultEndPoint(*self._routes[address])
        return DefaultEndPoint(address, _NodeInfo.get_broadcast_rpc_port(row) or self._port)


def execution_profile(
    local_dc: str | None, consistency: int, serial_consistency: int, request_timeout_s: float
) -> ExecutionProfile:
    """The one profile every request runs with."""
    return ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=local_dc or "")),
        consistency_level=consistency,
        serial_consistency_level=serial_consistency,
        request_timeout=request_timeout_s,
        row_factory=dict_factory,
        # Every failure reaches this layer, which decides it (a serial re-read, a
        # retry of the step, Recoverable): the driver's default would re-send on
        # overload or server errors unseen, conditional writes included.
        retry_policy=FallthroughRetryPolicy(),
    )


def _contact_points(points: Sequence[str], port: int, routes: NodeRoutes | None) -> list[Any]:
    if not routes:
        return list(points)
    return [DefaultEndPoint(*routes.get(p, (p, port))) for p in points]


class CqlSession:
    """A connected driver session plus prepared statements, by name."""

    def __init__(
        self,
        cluster: Cluster,
        session: Session,
        keyspace: str,
        requests: Counter[str],
        serial_consistency: int,
        request_timeout_s: float,
        *,
        send_path: SendPath = "auto",
        events: Counter[str] | None = None,
    ) -> None:
        self._cluster = cluster
        self._session = session
        self.keyspace = keyspace
        self.requests = requests
        self._serial = serial_consistency
        self._timeout = request_timeout_s
        self._prepared: dict[str, PreparedStatement] = {}
        self._closed = False
        self.interceptor: Interceptor | None = None
        self.send_path = send_path
        self.events: Counter[str] = Counter() if events is None else events
        """What the session noticed, by kind (``direct_path_refused``,
        ``direct_timeout``); the backend's ``Backend.events``."""
        self.off_loop = OffLoop()
        """Driver requests started off the loop because a borrow could wait (``borrow.py``)."""
        self.direct: DirectSender | None = None
        if send_path != "driver":
            self.direct = DirectSender(
                session, asyncio.get_running_loop(), self._driver_send, self.events
            )

    # --- connecting and closing ----------------------------------------------

    @classmethod
    async def connect(
        cls,
        contact_points: Sequence[str],
        *,
        port: int,
        keyspace: str,
        requests: Counter[str],
        username: str | None = None,
        password: str | None = None,
        local_dc: str | None = None,
        consistency: str = "LOCAL_QUORUM",
        serial_consistency: str = "SERIAL",
        request_timeout_s: float = 5.0,
        node_routes: NodeRoutes | None = None,
        send_path: SendPath = "auto",
        events: Counter[str] | None = None,
        tls: ClusterTls | None = None,
    ) -> CqlSession:
        """Connect, or raise StoreUnavailable / StoreInvalid (never naming a host)."""
        if not contact_points:
            raise StoreInvalid("scylla: at least one contact point is required")
        cl = consistency_level(consistency, CONSISTENCY_LEVELS)
        serial = consistency_level(serial_consistency, SERIAL_LEVELS)
        profile = execution_profile(local_dc, cl, serial, request_timeout_s)
        auth = None
        if username is not None:
            auth = PlainTextAuthProvider(username=username, password=password or "")
        routed: dict[str, Any] = {}
        if tls is None:  # the loop reactor does not speak TLS: the driver's own then
            routed["connection_class"] = loop_connection_class(asyncio.get_running_loop())
        else:
            routed["ssl_context"] = tls.context()
        if node_routes:
            routed["endpoint_factory"] = RoutedEndPointFactory(node_routes, port)
            routed["shard_aware_options"] = ShardAwareOptions(disable_shardaware_port=True)
        try:
            cluster = Cluster(
                _contact_points(contact_points, port, node_routes),
                port=port,
                protocol_version=PROTOCOL_VERSION,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                auth_provider=auth,
                connect_timeout=request_timeout_s,
                control_connection_timeout=request_timeout_s,
                # The driver's default backs off to 10 minutes: after a whole-cluster
                # outage a replica would stay NOT_SERVING that long once it is back.
                reconnection_policy=ExponentialReconnectionPolicy(0.5, RECONNECT_MAX_DELAY_S),
                # CQL frames here are small; lz4 saved nothing measurable and hides the
                # frame bodies from a counting proxy (toolkit/bench/cqlwire.py).
                compression=False,
                **routed,
            )
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"scylla: bad cluster settings ({type(exc).__name__})") from None
        try:
            session = await asyncio.wait_for(
                asyncio.to_thread(cluster.connect), timeout=4 * request_timeout_s + 10
            )
        except (*DRIVER_ERRORS, TimeoutError) as exc:
            await asyncio.to_thread(cluster.shutdown)
            what = "authentication failed" if _is_auth(exc) else "cannot connect to the cluster"
            raise StoreUnavailable(f"scylla: {what} ({type(exc).__name__})") from None
        session.default_fetch_size = None  # every query carries its own LIMIT
        cql = cls(
            cluster,
            session,
            keyspace,
            requests,
            serial,
            request_timeout_s,
            send_path=send_path,
            events=events,
        )
        try:
            cql.check_driver()
        except BaseException:
            await cql.close()
            raise
        return cql

    @property
    def session_id(self) -> str:
        """The ``SESSION_ID`` the driver reports to the cluster on every connection
        (``system_views.clients`` lists it), for counting this session's requests."""
        return str(getattr(self._cluster, "_session_id", ""))

    async def close(self) -> None:
        """Shut the cluster down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._cluster.shutdown)
        self.off_loop.close()

    # --- preparing -------------------------------------------------------------

    async def prepare(self, statements: Mapping[str, str]) -> None:
        """Prepare ``name -> CQL`` (with ``{ks}`` for the keyspace), once each."""

        def run() -> dict[str, PreparedStatement]:
            done = {}
            for name, text in statements.items():
                if name not in self._prepared:
                    done[name] = self._session.prepare(text.format(ks=self.keyspace))
            return done

        try:
            prepared = await asyncio.to_thread(run)
        except RequestValidationException as exc:
            raise StoreSchemaError(
                f"scylla: the schema does not match this version ({type(exc).__name__});"
                " run `message-committer migrate`"
            ) from None
        except DRIVER_ERRORS as exc:
            raise _translate(exc, "read") from None
        self._prepared.update(prepared)
        if self.direct is not None:
            self._check_frames(prepared.values())

    def check_driver(self) -> None:
        """The installed driver is the one the direct path was built for, with every
        part it uses, or the direct path is refused (``send_path``)."""
        if self.direct is None:
            return
        try:
            paths.check_version()
            paths.check_parts(self._session)
        except PathMismatch as exc:
            self.refuse_direct(str(exc))

    def _check_frames(self, statements: Iterable[PreparedStatement]) -> None:
        """The direct path's frames of these statements are the driver's own, or it
        is refused (``send_path``)."""
        if self.direct is None:
            return
        features: list[Any] = [None]  # Cassandra's: no extensions
        for pool in list(self._session._pools.values()):
            features.extend(c.features for c in list(pool._connections.values())[:1])
        try:
            paths.check_frames(self.direct, statements, features)
        except PathMismatch as exc:
            self.refuse_direct(str(exc))
        except Exception as exc:  # a driver part changed in a way no check names
            self.refuse_direct(f"{type(exc).__name__} while comparing frames")

    def refuse_direct(self, reason: str) -> None:
        """The direct path does not match the driver: one warning, one event, and
        every request through the driver from now on; with send path ``direct``,
        StoreMisconfigured instead. ``reason`` names no host, value or CQL."""
        if self.send_path == "direct":
            raise StoreMisconfigured(
                f"scylla: the direct send path does not match the installed driver ({reason})",
                f"install scylla-driver=={BUILT_FOR}, or set MC_SCYLLA_SEND_PATH=auto",
            )
        if self.direct is None:
            return
        self.direct = None
        self.events["direct_path_refused"] += 1
        log.warning(
            "scylla: the direct send path is off, every request goes through the driver: %s",
            reason,
        )

    # --- executing -------------------------------------------------------------

    async def read(self, name: str, params: Params, *, serial: bool = False) -> list[Row]:
        """A plain read or, with ``serial``, a linearizable one. Serial reads
        decide refused or unknown conditional writes, so when one fails the
        outcome stays unknown: StoreOutcomeUnknown."""
        call = Call(
            ((self._prepared[name], params),),
            consistency=self._serial if serial else None,
            idempotent=True,
        )
        self.requests["serial_read" if serial else "statement"] += 1
        return await self._run(name, call, "serial" if serial else "read")

    async def write(self, name: str, params: Params) -> None:
        """A plain, idempotent write."""
        self.requests["statement"] += 1
        await self._run(name, Call(((self._prepared[name], params),), idempotent=True), "write")

    async def write_batch(self, items: Sequence[tuple[str, Params]]) -> None:
        """Plain writes to one partition, applied together (an unlogged batch)."""
        call = Call(self._items(items), batch=True, idempotent=True)
        self.requests["statement"] += 1
        await self._run(f"batch:{items[0][0]}", call, "write")

    async def cas(self, name: str, params: Params) -> bool:
        """A conditional statement; True when applied.

        Raises StoreOutcomeUnknown when the statement may or may not have
        applied (a timeout during Paxos, a lost connection): the caller must
        re-read at serial consistency before deciding.
        """
        return (await self.cas_rows(name, params))[0]

    async def cas_rows(self, name: str, params: Params) -> tuple[bool, list[Row]]:
        """``cas``, with the rows the server returned: on a refusal, the current
        values of the columns the condition tested (ScyllaDB and Cassandra differ
        in what else they return, so callers treat them as hints only)."""
        self.requests["lwt"] += 1
        call = Call(((self._prepared[name], params),), conditional=True)
        rows = await self._run(name, call, "cas")
        return _applied(rows), rows

    async def cas_batch(self, items: Sequence[tuple[str, Params]]) -> bool:
        """A conditional batch on one partition; True when applied (see ``cas``)."""
        return (await self.cas_batch_rows(items))[0]

    async def cas_batch_rows(self, items: Sequence[tuple[str, Params]]) -> tuple[bool, list[Row]]:
        """``cas_batch``, with the rows the server returned (see ``cas_rows``)."""
        self.requests["lwt"] += 1
        call = Call(self._items(items), batch=True, conditional=True)
        rows = await self._run(f"batch:{items[0][0]}", call, "cas")
        return _applied(rows), rows

    def _items(self, items: Sequence[tuple[str, Params]]) -> list[tuple[PreparedStatement, Params]]:
        prepared = self._prepared
        return [(prepared[name], params) for name, params in items]

    async def simple(
        self, cql: str, params: Params = (), *, timeout_s: float | None = None, raw: bool = False
    ) -> list[Row]:
        """An unprepared statement (migrations, the schema check); ``{ks}`` is
        the keyspace unless ``raw``. Driver errors are translated like a read's, except that
        a rejected statement raises StoreSchemaError."""
        statement = SimpleStatement(cql if raw else cql.format(ks=self.keyspace))
        self.requests["statement"] += 1
        try:
            return await self._driver_send(statement, timeout_s or self._timeout, params)
        except RequestValidationException as exc:
            raise StoreSchemaError(
                f"scylla: schema statement rejected ({type(exc).__name__})"
            ) from None
        except DRIVER_ERRORS as exc:
            raise _translate(exc, "read") from None

    async def _run(self, name: str, call: Call, mode: Mode) -> list[Row]:
        if self._closed:
            raise StoreUnavailable("scylla: the backend is closed")
        try:
            if self.interceptor is None:
                return await self._send(call)
            return await self.interceptor(name, lambda: self._send(call))
        except DRIVER_ERRORS as exc:
            raise _translate(exc, mode) from None

    def _send(self, call: Call) -> asyncio.Future[list[Row]]:
        """The request as an asyncio future: straight onto a pooled connection
        (``direct.py``) or, when that path cannot send it, through the driver's
        ``execute_async``."""
        if self.direct is not None:
            try:
                sent = self.direct.send(call, self._timeout)
            except Exception as exc:  # nothing was sent; a driver part no longer fits
                self.refuse_direct(f"{type(exc).__name__} on the direct path")
                sent = None
            if sent is not None:
                return sent
        return self._driver_send(call.statement(), self._timeout)

    def _driver_send(
        self, statement: Any, limit_s: float, params: Params | None = None
    ) -> asyncio.Future[list[Row]]:
        """The driver's request as an asyncio future. Its callbacks run on this loop
        (``reactor.py``), so they resolve the future directly; the driver's own
        timer (``limit_s``) fails it with OperationTimedOut. Started on the loop
        only when its borrow cannot wait, else on a thread (``borrow.py``)."""
        result: asyncio.Future[list[Row]] = asyncio.get_running_loop().create_future()

        def start(timeout_s: float) -> None:
            future = self._session.execute_async(statement, params, timeout=timeout_s)
            future.add_callbacks(_resolve, _fail, callback_args=(result,), errback_args=(result,))

        if streams_free(self._session):
            start(limit_s)
        else:
            self.off_loop.submit(start, lambda exc: _fail(exc, result), limit_s)
        return result


def _resolve(rows: Any, result: asyncio.Future[list[Row]]) -> None:
    if events._get_running_loop() is result.get_loop():
        if not result.done():
            result.set_result(rows or [])
        return
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
        result.get_loop().call_soon_threadsafe(_settle, result, rows or [], None)


def _fail(exc: BaseException, result: asyncio.Future[list[Row]]) -> None:
    if events._get_running_loop() is result.get_loop():
        if not result.done():
            result.set_exception(exc)
        return
    with contextlib.suppress(RuntimeError):
        result.get_loop().call_soon_threadsafe(_settle, result, None, exc)


def _settle(
    result: asyncio.Future[list[Row]], rows: list[Row] | None, exc: BaseException | None
) -> None:
    if result.done():
        return
    if exc is not None:
        result.set_exception(exc)
    else:
        result.set_result(rows or [])


def _applied(rows: list[Row]) -> bool:
    """The ``[applied]`` flag only; other returned columns differ between servers.
    An answer without it says nothing of whether the write applied: unknown."""
    if not rows or "[applied]" not in rows[0]:
        raise StoreOutcomeUnknown("scylla: a conditional write returned no [applied] flag")
    return bool(rows[0]["[applied]"])


def _is_auth(exc: BaseException) -> bool:
    if isinstance(exc, AuthenticationFailed | Unauthorized):
        return True
    errors = getattr(exc, "errors", None)
    return isinstance(errors, dict) and any(
        isinstance(e, AuthenticationFailed | Unauthorized) for e in errors.values()
    )


def _translate(exc: BaseException, mode: Mode) -> StoreError:
    """The StoreError for a driver exception (no driver text is kept)."""
    kind = type(exc).__name__
    if isinstance(exc, RequestValidationException):
        if isinstance(exc, Unauthorized):
            return StoreUnavailable(f"scylla: not authorised ({kind})")
        return StoreInvalid(f"scylla: the request was rejected ({kind})")
    if isinstance(exc, AuthenticationFailed) or _is_auth(exc):
        return StoreUnavailable(f"scylla: authentication failed ({kind})")
    if mode == "serial":
        return StoreOutcomeUnknown(f"scylla: a serial re-read failed, outcome unknown ({kind})")
    if isinstance(exc, NoHostAvailable):
        # The driver ran out of hosts before any of them took the request (with
        # FallthroughRetryPolicy an error after sending is raised as itself):
        # nothing was sent, so nothing can have applied.
        return StoreUnavailable(f"scylla: no host took the request, nothing was sent ({kind})")
    if mode == "cas" or (
        mode == "write" and isinstance(exc, WriteTimeout | WriteFailure | OperationTimedOut)
    ):
        # A conditional write may have been accepted by Paxos whatever went
        # wrong after it was sent; a plain write may have reached replicas.
        return StoreOutcomeUnknown(f"scylla: the outcome of a write is unknown ({kind})")
    return StoreUnavailable(f"scylla: request failed ({kind})")
