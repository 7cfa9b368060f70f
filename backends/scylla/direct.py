"""Prepared EXECUTEs and BATCHes sent straight onto a pooled connection.

The driver's ``Session.execute_async`` binds a ``BoundStatement`` and builds a
``ResponseFuture`` per request: an ``Event``, a ``Condition``, a callback
list, a query-plan generator, a ``partial`` per attempt, retry and
speculative-execution bookkeeping. Profiled on a fresh commit
(docs/performance.md, "Scylla commit cost"), that was about 45 % of the event
loop's CPU, for machinery this backend never uses: the driver never retries
(``FallthroughRetryPolicy``) and one coroutine awaits each request.

``DirectSender.send`` does one attempt, with the driver's own parts:

* values are serialised by the prepared statement's column types (``_Plan``,
  worked out once per statement) and the routing key is packed as
  ``BoundStatement`` packs it;
* the coordinator is the first live local replica of the token: in ring
  order for conditional statements and serial reads (one coordinator per
  partition, as the token-aware policy keeps LWTs unshuffled), else in turn;
* the stream id is borrowed from that host's pool with the routing key and
  token (Scylla's shard awareness), without waiting (``borrow.py``), and
  given back with the answer;
* the message is a ``frames.Frame`` (the fields of the driver's
  ``ExecuteMessage`` / ``BatchMessage``) with the profile's consistency levels
  and the cluster's client timestamp, packed by ``frames.encode`` (byte-equal
  to the driver's frame: ``send_path.check_frames``) and decoded by the
  session's protocol handler, rows answers with their metadata parsed once
  per statement and shape (``results.py``). Rows come without their
  metadata only where the driver itself asks for that (the result-metadata
  id was negotiated: Scylla's extension), so an ``ALTER`` after PREPARE is
  always seen;
* the timeout is a deadline in one queue per session, swept by a single
  ``loop.call_at`` timer (requests share the session's timeout, so deadlines
  arrive in order; one that does not gets a timer of its own). On expiry
  the stream id is orphaned exactly as the driver orphans it (a late answer
  must not be taken for the next request's) and the request fails with
  ``OperationTimedOut``;
* errors are the driver's: an error answer becomes its ``to_exception()``
  (``WriteTimeout``, ``Unavailable``, ...) or the ``ErrorMessage`` itself, a
  broken connection ``ConnectionShutdown`` / ``ConnectionException``.

``send`` returns ``None`` whenever it cannot send (a value that does not
serialise, no routing key or token map, no live local replica with a pool, no
stream free, the connection closed or busy), and the caller goes through
``execute_async``, which tries the rest of the plan and reports bad values
its own way. An ``UNPREPARED`` answer is handed over the same way: the
statement did not run, and the driver re-prepares it on that host and runs
it. Nothing is sent twice: a request is handed over only before a frame is
queued, or on an answer that proves the statement did not run.
``DirectSender.passed`` counts the handovers by reason.

Responses are decoded on the loop thread (``reactor.py``); a connection that
breaks may fail its requests from a driver thread, so every completion is
moved onto the loop first.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from cassandra import ConsistencyLevel, OperationTimedOut
from cassandra.cluster import EXEC_PROFILE_DEFAULT, NoHostAvailable, Session
from cassandra.connection import ConnectionBusy, ConnectionException, ConnectionShutdown
from cassandra.policies import HostDistance
from cassandra.pool import NoConnectionsAvailable
from cassandra.protocol import (
    RESULT_KIND_ROWS,
    RESULT_KIND_VOID,
    ErrorMessage,
    PreparedQueryNotFound,
    ResultMessage,
)
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    BoundStatement,
    PreparedStatement,
    dict_factory,
)

from backends.scylla.frames import BATCH, EXECUTE, Frame
from backends.scylla.frames import encode as encode_frame
from backends.scylla.results import Decode, ResultCache

Rows = list[dict[str, Any]]
Params = Sequence[object]
DriverSend = Callable[[Any, float], "asyncio.Future[Rows]"]
"""``(statement, timeout_s)``: send through ``execute_async`` (the driver's own path)."""

_NO_STREAM = (NoConnectionsAvailable, ConnectionBusy, ConnectionException, NoHostAvailable)
"""What a borrow raises: nothing was sent (a pool shut down since ``is_shutdown`` was
read raises ConnectionException, "Pool is shutdown")."""
_NOT_QUEUED = (ConnectionBusy, ConnectionShutdown)
"""What ``send_msg`` raises before it queues the frame (closed, defunct, not writable)."""
_LOCAL = (HostDistance.LOCAL_RACK, HostDistance.LOCAL)
PROTOCOL_VERSION = 4
"""The native protocol version of every session (``CqlSession.connect`` sets it)."""


class Call:
    """One request: a prepared statement and its values, or an unlogged batch of them."""

    __slots__ = ("batch", "conditional", "consistency", "idempotent", "items")

    def __init__(
        self,
        items: Sequence[tuple[PreparedStatement, Params]],
        *,
        batch: bool = False,
        consistency: int | None = None,
        idempotent: bool = False,
        conditional: bool = False,
    ) -> None:
        self.items = items
        self.batch = batch
        self.consistency = consistency
        self.idempotent = idempotent
        self.conditional = conditional
        """A conditional write (``IF ...``), said by the caller: ScyllaDB flags such
        statements at PREPARE (``is_lwt``), Cassandra never does."""

    def ordered(self) -> bool:
        """Sent to the first live replica in ring order (one Paxos coordinator per
        partition): conditional writes and serial reads."""
        if self.conditional:
            return True
        if self.consistency is not None and ConsistencyLevel.is_serial(self.consistency):
            return True
        return any(prepared.is_lwt() for prepared, _ in self.items)

    def statement(self) -> BoundStatement | BatchStatement:
        """The driver's statement for the same request (``execute_async``)."""
        if self.batch:
            statement: BoundStatement | BatchStatement = BatchStatement(
                batch_type=BatchType.UNLOGGED
            )
            for prepared, params in self.items:
                statement.add(prepared, params)
        else:
            prepared, params = self.items[0]
            statement = prepared.bind(params)
        if self.consistency is not None:
            statement.consistency_level = self.consistency
        statement.is_idempotent = self.idempotent
        return statement


class _Plan:
    """What a prepared statement needs per request, worked out once."""

    __slots__ = ("keyspace", "prepared", "results", "routing", "serializers", "table")

    def __init__(self, prepared: PreparedStatement, decode: Decode) -> None:
        meta = prepared.column_metadata or ()
        self.prepared = prepared
        self.results = ResultCache(decode)
        """Its answers' metadata, parsed once per shape (``results.py``)."""
        self.serializers = tuple(column.type.serialize for column in meta)
        self.routing: tuple[int, ...] = tuple(prepared.routing_key_indexes or ())
        self.keyspace = meta[0].keyspace_name if meta else None
        self.table = meta[0].table_name if meta else None

    def encode(self, params: Params) -> list[bytes | None]:
        """The bound values, as ``BoundStatement.bind`` serialises them; raises on
        anything it does not handle itself (the driver's path then reports it)."""
        if len(params) != len(self.serializers):
            raise ValueError("not one value per bind marker")
        values: list[Any] = [
            value if value is None or value is UNSET_VALUE else serialize(value, PROTOCOL_VERSION)
            for serialize, value in zip(self.serializers, params, strict=True)
        ]
        for index in self.routing:
            if values[index] is None or values[index] is UNSET_VALUE:
                raise ValueError("a partition key value is missing")
        return values

    def routing_key(self, values: list[bytes | None]) -> bytes | None:
        routing = self.routing
        if not routing:
            return None
        if len(routing) == 1:
            return values[routing[0]]
        return b"".join(
            struct.pack(">H", len(part)) + part + b"\x00"
            for part in (values[index] for index in routing)
            if part is not None
        )


class DirectSender:
    """One session's direct path; ``send`` runs on the loop thread only."""

    def __init__(
        self,
        session: Session,
        loop: asyncio.AbstractEventLoop,
        driver_send: DriverSend,
        events: Counter[str] | None = None,
    ) -> None:
        profile = session.cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT]
        self._session = session
        self.session = session
        """The driver's session (``send_path.check_frames`` builds its messages)."""
        self._cluster = session.cluster
        self._loop = loop
        self._thread = threading.get_ident()
        self._policy = profile.load_balancing_policy
        self._cl = profile.consistency_level
        self._serial_cl = profile.serial_consistency_level
        self._handler = session.client_protocol_handler
        self._plans: dict[int, _Plan] = {}
        self._turn = 0
        self._deadlines: deque[tuple[float, _Request]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self.driver_send = driver_send
        self.sent = 0
        """Requests this path sent."""
        self.passed: Counter[str] = Counter()
        """Requests handed to ``execute_async`` instead, by reason."""
        self.events: Counter[str] = Counter() if events is None else events
        """The backend's events (``Backend.events``): ``direct_timeout`` counts the
        requests this path sent that got no answer within their timeout."""

    def send(self, call: Call, timeout_s: float) -> asyncio.Future[Rows] | None:
        """The call's response as a future, or None: use ``driver_send`` instead."""
        encoded = []
        try:
            for prepared, params in call.items:
                plan = self._plan(prepared)
                encoded.append((plan.encode(params), plan))
        except Exception:  # the driver's bind reports it the driver's way
            self.passed["values"] += 1
            return None
        values, plan = encoded[0]
        routing_key = plan.routing_key(values)
        token_map = self._cluster.metadata.token_map
        keyspace = plan.keyspace or self._session.keyspace
        if routing_key is None or token_map is None or keyspace is None:
            self.passed["routing"] += 1
            return None
        token = token_map.token_class.from_key(routing_key)
        host = self._coordinator(token_map.get_replicas(keyspace, token), call.ordered())
        message = self._message(call, encoded)  # raises only if the driver changed
        pool = self._session._pools.get(host) if host is not None else None
        if pool is None or pool.is_shutdown:
            self.passed["host"] += 1
            return None
        try:
            connection, request_id = pool.borrow_connection(
                timeout=0,  # never wait on the loop (borrow.py)
                routing_key=routing_key,
                keyspace=keyspace,
                table=plan.table,
                routing_token=token,
            )
        except _NO_STREAM:
            self.passed["stream"] += 1
            return None
        request = _Request(self, call, host, pool, connection, request_id, timeout_s)
        try:
            connection.send_msg(
                message,
                request_id,
                cb=request.on_response,
                encoder=encode_frame,
                decoder=self._handler.decode_message if call.batch else plan.results.decode,
                result_metadata=None if call.batch else plan.prepared.result_metadata,
            )
        except _NOT_QUEUED:  # closed or busy, nothing queued: the driver's path decides
            _unborrow(pool, connection, request_id)
            self.passed["connection"] += 1
            return None
        except BaseException:  # not a state of the connection: the caller decides
            _unborrow(pool, connection, request_id)
            raise
        self._expire_at(request, self._loop.time() + timeout_s)
        self.sent += 1
        return request.result

    def _plan(self, prepared: PreparedStatement) -> _Plan:
        # The plan holds its statement, so the id is never reused while it is here.
        plan = self._plans.get(id(prepared))
        if plan is None:
            plan = self._plans[id(prepared)] = _Plan(prepared, self._handler.decode_message)
        return plan

    def _coordinator(self, replicas: Sequence[Any], ordered: bool) -> Any:
        """The first live local replica, as the token-aware policy orders them: in
        ring order for LWTs and serial reads (one coordinator per partition keeps
        Paxos rounds from competing), else taking turns."""
        count = len(replicas)
        if not count:
            return None
        first = 0
        if count > 1 and not ordered:
            first = self._turn % count
            self._turn += 1
        distance = self._policy.distance
        for step in range(count):
            host = replicas[(first + step) % count]
            if host.is_up and distance(host) in _LOCAL:
                return host
        return None

    def _message(self, call: Call, encoded: list[tuple[list[bytes | None], _Plan]]) -> Frame:
        cl = self._cl if call.consistency is None else call.consistency
        serial = self._serial_cl
        timestamp = None
        if self._session.use_client_timestamp:
            timestamp = self._cluster.timestamp_generator()
        if call.batch:
            queries = [(plan.prepared.query_id, values) for values, plan in encoded]
            return Frame(BATCH, queries, cl, serial, timestamp)
        values, plan = encoded[0]
        # As the driver does: metadata and id read as one pair; the rows come back
        # without metadata only when the connection negotiated the id
        # (``ExecuteMessage._should_skip_metadata``), so a changed schema is seen.
        metadata, metadata_id = plan.prepared.result_metadata_and_id
        return Frame(
            EXECUTE,
            ((plan.prepared.query_id, values),),
            cl,
            serial,
            timestamp,
            fetch_size=self._session.default_fetch_size,
            skip_meta=bool(metadata) and metadata_id is not None,
            result_metadata_id=metadata_id,
        )

    def _expire_at(self, request: _Request, due: float) -> None:
        queue = self._deadlines
        if queue and due < queue[-1][0]:  # a shorter timeout than the one before
            self._loop.call_at(due, request.on_timeout)
            return
        queue.append((due, request))
        if self._sweeper is None:
            self._sweeper = self._loop.call_at(due, self._sweep)

    def _sweep(self) -> None:
        """Time out what is due, drop what was answered, wait for the next deadline."""
        self._sweeper = None
        queue, now = self._deadlines, self._loop.time()
        while queue:
            due, request = queue[0]
            if request.pending and due > now:
                self._sweeper = self._loop.call_at(due, self._sweep)
                return
            queue.popleft()
            request.on_timeout()  # does nothing when it was answered

    def on_loop(self) -> bool:
        return threading.get_ident() == self._thread


def _unborrow(pool: Any, connection: Any, request_id: int) -> None:
    """Give back a stream id that carried nothing (the driver's path would leak it)."""
    with connection.lock:
        connection._requests.pop(request_id, None)
        connection.request_ids.append(request_id)
    pool.return_connection(connection)


class _Request:
    """One request in flight: its future and stream."""

    __slots__ = (
        "_call",
        "_connection",
        "_host",
        "_pool",
        "_request_id",
        "_sender",
        "_timeout_s",
        "borrowed",
        "pending",
        "result",
    )

    def __init__(
        self,
        sender: DirectSender,
        call: Call,
        host: Any,
        pool: Any,
        connection: Any,
        request_id: int,
        timeout_s: float,
    ) -> None:
        self._sender = sender
        self._call = call
        self._host = host
        self._pool = pool
        self._connection = connection
        self._request_id = request_id
        self._timeout_s = timeout_s
        self.result: asyncio.Future[Rows] = sender._loop.create_future()
        self.pending = True
        """No answer yet (nor a timeout)."""
        self.borrowed = True
        """The stream is ours to give back (an answer gives it back, or a timeout
        orphans it)."""

    def on_response(self, response: Any) -> None:
        if not self._sender.on_loop():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._sender._loop.call_soon_threadsafe(self.on_response, response)
            return
        if self.borrowed:
            self.borrowed = False
            if not self._pool.is_shutdown:
                self._pool.return_connection(self._connection)
        if not self.pending:
            return  # timed out already: the caller has its OperationTimedOut
        self.pending = False
        if isinstance(response, ResultMessage):
            self._settle_rows(response)
        elif isinstance(response, PreparedQueryNotFound):
            # Not executed: the driver's path re-prepares on that host and runs it.
            self._sender.passed["unprepared"] += 1
            self._chain(self._sender.driver_send(self._call.statement(), self._timeout_s))
        elif isinstance(response, ErrorMessage):
            self._fail(response.to_exception() if hasattr(response, "to_exception") else response)
        elif isinstance(response, ConnectionException):
            if not isinstance(response, ConnectionShutdown):
                self._connection.defunct(response)
            self._fail(response)
        elif isinstance(response, Exception):
            self._fail(response)
        else:
            error = ConnectionException(f"unexpected message {type(response).__name__}")
            self._connection.defunct(error)
            self._fail(error)

    def _settle_rows(self, response: ResultMessage) -> None:
        if response.kind == RESULT_KIND_ROWS:
            self._note_metadata(response)
            rows: Rows = dict_factory(response.column_names, response.parsed_rows)
        elif response.kind == RESULT_KIND_VOID:
            rows = []
        else:  # SET_KEYSPACE / SCHEMA_CHANGE: never the answer to our DML
            rows = []
        if not self.result.done():
            self.result.set_result(rows)

    def _note_metadata(self, response: ResultMessage) -> None:
        """METADATA_CHANGED (Scylla's metadata-id extension): keep the statement's
        cached metadata and its id as one pair, as the driver does."""
        new_id = getattr(response, "result_metadata_id", None)
        if new_id is None or self._call.batch:
            return
        if response.column_metadata:
            self._call.items[0][0].update_result_metadata(response.column_metadata, new_id)

    def _chain(self, inner: asyncio.Future[Rows]) -> None:
        def done(future: asyncio.Future[Rows]) -> None:
            if self.result.done():
                return
            if future.cancelled():
                self.result.cancel()
            elif future.exception() is not None:
                self.result.set_exception(future.exception())  # type: ignore[arg-type]
            else:
                self.result.set_result(future.result())

        inner.add_done_callback(done)

    def _fail(self, exc: BaseException) -> None:
        if not self.result.done():
            self.result.set_exception(exc)

    def on_timeout(self) -> None:
        """The driver's timeout: orphan the stream (a late answer is dropped), then fail."""
        if not self.pending:
            return
        self.pending = False
        connection = self._connection
        # No callback left means the connection is failing its requests: that answer is
        # on its way and gives the stream back.
        if connection._requests.pop(self._request_id, None) is not None:
            self.borrowed = False
            with connection.lock:
                connection.orphaned_request_ids.add(self._request_id)
                if len(connection.orphaned_request_ids) >= connection.orphaned_threshold:
                    connection.orphaned_threshold_reached = True
            if not self._pool.is_shutdown:
                self._pool.return_connection(connection, stream_was_orphaned=True)
        self._sender.events["direct_timeout"] += 1
        errors = {str(self._host.endpoint): "Client request timeout"}
        self._fail(OperationTimedOut(errors, self._host))
