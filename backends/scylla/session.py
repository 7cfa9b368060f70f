"""The driver boundary: one connected session, asyncio-friendly, counted, translated.

Everything the Scylla backend sends goes through ``CqlSession``:

* the driver's ``ResponseFuture`` is bridged to an asyncio future with
  ``add_callbacks`` + ``loop.call_soon_threadsafe`` (the driver answers on its
  own I/O thread), with an outer deadline so no await can hang forever;
* statements are prepared once per session, by name;
* every request is counted in ``requests``: ``"lwt"`` per conditional
  statement or conditional batch, ``"statement"`` per plain one and
  ``"serial_read"`` per read at SERIAL / LOCAL_SERIAL (a Paxos round, but not
  a conditional write);
* driver exceptions become ``StoreError``s here and nowhere else. Texts name
  the kind of failure and the driver's exception class, never a host, a
  credential, a table or CQL; causes are dropped (``from None``) because the
  driver's own texts carry host addresses.

Consistency (DESIGN §8, docs/scylla.md): plain reads and writes use
``consistency`` (default LOCAL_QUORUM); conditional writes use
``serial_consistency`` (default SERIAL) for their Paxos phase and
``consistency`` for their commit; re-reads after a refused or unknown
conditional write use ``serial_consistency``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
)
from cassandra.connection import ConnectionException
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import (
    BatchStatement,
    BatchType,
    PreparedStatement,
    SimpleStatement,
    dict_factory,
)

from service.domain.errors import (
    StoreError,
    StoreInvalid,
    StoreOutcomeUnknown,
    StoreSchemaError,
    StoreUnavailable,
)

Row = dict[str, Any]
Params = Sequence[object]
Send = Callable[[], Awaitable[list[Row]]]
Mode = Literal["read", "serial", "write", "cas"]
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
DRIVER_ERRORS = (DriverException, NoHostAvailable, ConnectionException, OSError)
"""What the driver raises: its own exceptions are not all DriverExceptions."""
_DEADLINE_SLACK_S = 5.0  # the driver's own timeout fires first; this only bounds a lost callback

RECONNECT_MAX_DELAY_S = 10.0
"""Longest pause between reconnection attempts to a node that went away."""


def consistency_level(name: str, allowed: Sequence[str]) -> int:
    """The driver's value for a level name (case-insensitive), or StoreInvalid."""
    upper = name.strip().upper()
    if upper not in allowed:
        raise StoreInvalid(f"consistency level must be one of {', '.join(allowed)}")
    return int(ConsistencyLevel.name_to_value[upper])


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
    ) -> CqlSession:
        """Connect, or raise StoreUnavailable / StoreInvalid (never naming a host)."""
        if not contact_points:
            raise StoreInvalid("scylla: at least one contact point is required")
        cl = consistency_level(consistency, CONSISTENCY_LEVELS)
        serial = consistency_level(serial_consistency, SERIAL_LEVELS)
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(
                DCAwareRoundRobinPolicy(local_dc=local_dc or "")
            ),
            consistency_level=cl,
            serial_consistency_level=serial,
            request_timeout=request_timeout_s,
            row_factory=dict_factory,
        )
        auth = None
        if username is not None:
            auth = PlainTextAuthProvider(username=username, password=password or "")
        try:
            cluster = Cluster(
                list(contact_points),
                port=port,
                protocol_version=4,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                auth_provider=auth,
                connect_timeout=request_timeout_s,
                control_connection_timeout=request_timeout_s,
                # The driver's default backs off to 10 minutes: after a whole-cluster
                # outage a replica would stay NOT_SERVING that long once it is back.
                reconnection_policy=ExponentialReconnectionPolicy(0.5, RECONNECT_MAX_DELAY_S),
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
        return cls(cluster, session, keyspace, requests, serial, request_timeout_s)

    async def close(self) -> None:
        """Shut the cluster down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._cluster.shutdown)

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

    # --- executing -------------------------------------------------------------

    async def read(self, name: str, params: Params, *, serial: bool = False) -> list[Row]:
        """A plain read or, with ``serial``, a linearizable one. Serial reads
        decide refused or unknown conditional writes, so when one fails the
        outcome stays unknown: StoreOutcomeUnknown."""
        bound = self._prepared[name].bind(params)
        bound.is_idempotent = True
        if serial:
            bound.consistency_level = self._serial
        self.requests["serial_read" if serial else "statement"] += 1
        return await self._run(name, bound, "serial" if serial else "read")

    async def write(self, name: str, params: Params) -> None:
        """A plain, idempotent write."""
        bound = self._prepared[name].bind(params)
        bound.is_idempotent = True
        self.requests["statement"] += 1
        await self._run(name, bound, "write")

    async def write_batch(self, items: Sequence[tuple[str, Params]]) -> None:
        """Plain writes to one partition, applied together (an unlogged batch)."""
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for name, params in items:
            batch.add(self._prepared[name], params)
        batch.is_idempotent = True
        self.requests["statement"] += 1
        await self._run(f"batch:{items[0][0]}", batch, "write")

    async def cas(self, name: str, params: Params) -> bool:
        """A conditional statement; True when applied.

        Raises StoreOutcomeUnknown when the statement may or may not have
        applied (a timeout during Paxos, a lost connection): the caller must
        re-read at serial consistency before deciding.
        """
        self.requests["lwt"] += 1
        rows = await self._run(name, self._prepared[name].bind(params), "cas")
        return _applied(rows)

    async def cas_batch(self, items: Sequence[tuple[str, Params]]) -> bool:
        """A conditional batch on one partition; True when applied (see ``cas``)."""
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for name, params in items:
            batch.add(self._prepared[name], params)
        self.requests["lwt"] += 1
        rows = await self._run(f"batch:{items[0][0]}", batch, "cas")
        return _applied(rows)

    async def simple(
        self, cql: str, params: Params = (), *, timeout_s: float | None = None, raw: bool = False
    ) -> list[Row]:
        """An unprepared statement (migrations, the schema check); ``{ks}`` is
        the keyspace unless ``raw``. Driver errors are translated like a read's, except that
        a rejected statement raises StoreSchemaError."""
        statement = SimpleStatement(cql if raw else cql.format(ks=self.keyspace))
        self.requests["statement"] += 1
        try:
            return await self._send(statement, params, timeout_s or self._timeout)
        except RequestValidationException as exc:
            raise StoreSchemaError(
                f"scylla: schema statement rejected ({type(exc).__name__})"
            ) from None
        except DRIVER_ERRORS as exc:
            raise _translate(exc, "read") from None

    async def _run(self, name: str, statement: Any, mode: Mode) -> list[Row]:
        if self._closed:
            raise StoreUnavailable("scylla: the backend is closed")

        async def send() -> list[Row]:
            return await self._send(statement, None, self._timeout)

        try:
            if self.interceptor is not None:
                return await self.interceptor(name, send)
            return await send()
        except DRIVER_ERRORS as exc:
            raise _translate(exc, mode) from None

    async def _send(self, statement: Any, params: Params | None, limit_s: float) -> list[Row]:
        loop = asyncio.get_running_loop()
        result: asyncio.Future[list[Row]] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if result.done():
                return
            if ok:
                result.set_result(list(value or ()))
            else:
                result.set_exception(value)

        def post(ok: bool, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(settle, ok, value)

        future = self._session.execute_async(statement, params, timeout=limit_s)
        future.add_callbacks(lambda rows: post(True, rows), lambda exc: post(False, exc))
        try:
            return await asyncio.wait_for(result, limit_s + _DEADLINE_SLACK_S)
        except TimeoutError:
            raise OperationTimedOut("no answer from the driver") from None


def _applied(rows: list[Row]) -> bool:
    """The ``[applied]`` flag only; other returned columns differ between servers."""
    if not rows or "[applied]" not in rows[0]:
        raise StoreUnavailable("scylla: a conditional write returned no [applied] flag")
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
    if mode == "cas" or (
        mode == "write" and isinstance(exc, WriteTimeout | WriteFailure | OperationTimedOut)
    ):
        # A conditional write may have been accepted by Paxos whatever went
        # wrong after it was sent; a plain write may have reached replicas.
        return StoreOutcomeUnknown(f"scylla: the outcome of a write is unknown ({kind})")
    return StoreUnavailable(f"scylla: request failed ({kind})")
