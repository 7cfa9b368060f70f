"""The direct EXECUTE/BATCH path (``backends/scylla/direct.py``) against a real CQL node.

Each case checks one promise of the module: what it sends goes straight onto
a pooled connection and reads back right; what it cannot send goes through
the driver, which then behaves as before (re-preparing, reporting bad values);
a timed-out stream stays orphaned until its late answer arrives; a broken
connection fails every request on it, also from a driver thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from cassandra import OperationTimedOut
from cassandra.connection import ConnectionException, ConnectionShutdown
from cassandra.pool import NoConnectionsAvailable
from cassandra.protocol import ProtocolHandler

from backends.scylla import direct as direct_module
from backends.scylla import send_path
from backends.scylla.commits import COLUMNS as COMMIT_COLUMNS
from backends.scylla.direct import Call, DirectSender
from backends.scylla.history import READ_COLUMNS as HISTORY_COLUMNS
from backends.scylla.session import CqlSession
from service.domain.errors import StoreOutcomeUnknown, StoreUnavailable
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness

pytestmark = pytest.mark.scylla

SKIP_METADATA = 0x02  # the query flag (native protocol v4, section 4.1.4)

STATEMENTS = {
    "put": "INSERT INTO {ks}.%s (a, b, c, v) VALUES (?, ?, ?, ?)",
    "put_new": "INSERT INTO {ks}.%s (a, b, c, v) VALUES (?, ?, ?, ?) IF NOT EXISTS",
    "bump": "UPDATE {ks}.%s SET v = ? WHERE a = ? AND b = ? AND c = ? IF v = ?",
    "get": "SELECT c, v FROM {ks}.%s WHERE a = ? AND b = ?",
    "get_all": "SELECT * FROM {ks}.%s WHERE a = ? AND b = ?",
    "get_commented": "SELECT /*x*/ * FROM {ks}.%s WHERE a = ? AND b = ?",
}


@pytest.fixture
async def cql(scylla: ScyllaHarness) -> AsyncIterator[CqlSession]:
    """A session with a table of its own, keyed by (a, b), in the suite's keyspace."""
    table = f"probe_{uuid.uuid4().hex[:10]}"
    session = await CqlSession.connect(
        [scylla.host], port=scylla.port, keyspace=scylla.keyspace, requests=Counter()
    )
    session.probe = table  # type: ignore[attr-defined]
    try:
        await _create_probe(session)
        await session.prepare({name: cql % table for name, cql in STATEMENTS.items()})
        yield session
    finally:
        await session.simple(f"DROP TABLE IF EXISTS {{ks}}.{table}", timeout_s=30)
        await session.close()


async def _create_probe(session: CqlSession) -> None:
    table = session.probe  # type: ignore[attr-defined]
    await session.simple(
        f"CREATE TABLE {{ks}}.{table} (a text, b text, c int, v int, PRIMARY KEY ((a, b), c))",
        timeout_s=30,
    )


def _direct(session: CqlSession) -> DirectSender:
    assert session.direct is not None
    return session.direct


def _call(session: CqlSession, name: str, *params: object) -> Call:
    return Call(((session._prepared[name], params),))


@contextlib.contextmanager
def _answers_held(session: CqlSession) -> Iterator[None]:
    """No answer is read off the session's pooled connections inside, so a request's
    timeout of 0 fires before its answer whatever the scheduling. Without this, an
    answer can win: the loop reads a socket after the same iteration's sends, so a
    thread stalled between the two (CI's load) reads a late answer of an earlier
    request together with the new request's own."""
    loop = asyncio.get_running_loop()
    connections = [c for p in session._session._pools.values() for c in p._connections.values()]
    for connection in connections:
        loop.remove_reader(connection._fd)
    try:
        yield
    finally:
        for connection in connections:
            connection._attach()  # the reactor's own: skips a closed or defunct connection


async def test_statements_and_batches_go_direct_and_read_back(cql: CqlSession) -> None:
    direct = _direct(cql)
    await cql.write("put", ("a", "b", 1, 10))
    await cql.write_batch([("put", ("a", "b", 2, 20)), ("put", ("a", "b", 3, 30))])
    assert await cql.cas("put_new", ("a", "b", 4, 40))
    assert not await cql.cas("put_new", ("a", "b", 4, 41))
    applied, rows = await cql.cas_rows("bump", (11, "a", "b", 1, 99))
    assert not applied and rows[0]["v"] == 10  # a refusal returns the tested column
    assert await cql.cas_batch([("bump", (12, "a", "b", 1, 10)), ("bump", (21, "a", "b", 2, 20))])
    plain = await cql.read("get", ("a", "b"))
    serial = await cql.read("get", ("a", "b"), serial=True)
    expected = [{"c": 1, "v": 12}, {"c": 2, "v": 21}, {"c": 3, "v": 30}, {"c": 4, "v": 40}]
    assert plain == serial == expected
    assert await cql.read("get", ("a", "other")) == []
    assert direct.sent == 9 and not direct.passed


async def test_the_routing_key_is_the_drivers(cql: CqlSession) -> None:
    """A composite partition key is packed as BoundStatement packs it, so the
    request goes to the same replica and shard."""
    prepared = cql._prepared["put"]
    for a, b in [("a", "b"), ("", "x"), ("long" * 40, "é")]:
        plan = _direct(cql)._plan(prepared)
        params = (a, b, 1, None)
        assert plan.routing_key(plan.encode(params)) == prepared.bind(params).routing_key


async def test_an_unprepared_statement_is_reprepared_by_the_driver(
    scylla: ScyllaHarness, cql: CqlSession
) -> None:
    await cql.write("put", ("a", "b", 1, 10))
    # Dropping the table makes the node forget the statements prepared on it.
    await cql.simple(f"DROP TABLE {{ks}}.{cql.probe}", timeout_s=30)  # type: ignore[attr-defined]
    await _create_probe(cql)
    await cql.write("put", ("a", "b", 2, 20))
    assert await cql.read("get", ("a", "b")) == [{"c": 2, "v": 20}]
    assert _direct(cql).passed["unprepared"] >= 1


async def test_bad_values_are_reported_by_the_drivers_bind(cql: CqlSession) -> None:
    with pytest.raises(TypeError, match="invalid type for column"):
        await cql.write("put", ("a", "b", "not an int", 1))
    assert _direct(cql).passed["values"] == 1
    assert await cql.read("get", ("a", "b")) == []  # nothing was written


async def test_a_timed_out_request_orphans_its_stream_until_the_answer_comes(
    cql: CqlSession,
) -> None:
    direct = _direct(cql)
    pool = next(iter(cql._session._pools.values()))
    (connection,) = pool._connections.values()
    idle = connection.in_flight
    with _answers_held(cql):  # expires before any answer
        sent = direct.send(_call(cql, "put_new", "a", "b", 1, 1), 0.0)
        assert sent is not None
        with pytest.raises(OperationTimedOut):
            await sent
    assert cql.events["direct_timeout"] == 1  # the backend's events: proof it ran
    assert len(connection.orphaned_request_ids) == 1  # the answer has not come yet
    for _ in range(200):  # the late answer frees the stream
        if not connection.orphaned_request_ids:
            break
        await asyncio.sleep(0.01)
    assert not connection.orphaned_request_ids and connection.in_flight == idle
    # The conditional insert was applied on the node although its caller timed out:
    # exactly why a timeout of a conditional write is an unknown outcome.
    assert await cql.read("get", ("a", "b"), serial=True) == [{"c": 1, "v": 1}]


async def test_a_timed_out_conditional_write_is_an_unknown_outcome(cql: CqlSession) -> None:
    cql._timeout = 0.0
    with _answers_held(cql):  # every request expires before its answer can be read
        with pytest.raises(StoreOutcomeUnknown):
            await cql.cas("put_new", ("a", "b", 1, 1))
        with pytest.raises(StoreUnavailable):
            await cql.read("get", ("a", "b"))


@pytest.mark.parametrize("from_thread", [False, True], ids=["on-the-loop", "from-a-thread"])
async def test_a_broken_connection_fails_every_request_on_it(
    cql: CqlSession, from_thread: bool
) -> None:
    direct = _direct(cql)
    pool = next(iter(cql._session._pools.values()))
    (connection,) = pool._connections.values()
    pending = [direct.send(_call(cql, "get", "a", f"b{i}"), 5.0) for i in range(3)]
    assert all(p is not None for p in pending)
    cut = ConnectionException("cut by the test")
    if from_thread:  # the driver fails requests of a dead connection from its threads
        await asyncio.to_thread(connection.defunct, cut)
    else:
        connection.defunct(cut)
    results = await asyncio.gather(*(p for p in pending if p is not None), return_exceptions=True)
    assert all(isinstance(r, ConnectionShutdown) for r in results), results
    for _ in range(300):  # the driver reconnects; then requests go direct again
        try:
            assert await cql.read("get", ("a", "b")) == []
            break
        except StoreUnavailable:
            await asyncio.sleep(0.05)
    sent = direct.sent
    await cql.read("get", ("a", "b"))
    assert direct.sent == sent + 1


async def test_no_read_asks_for_rows_without_metadata_unless_the_id_was_negotiated(
    cql: CqlSession,
) -> None:
    """SKIP_METADATA only where the node can tell a stale cache (Scylla's metadata
    id), as the driver does: never on Cassandra's v4, whatever the SELECT looks
    like (a comment before ``*`` used to pass for named columns)."""
    direct = _direct(cql)
    pool = next(iter(cql._session._pools.values()))
    (connection,) = pool._connections.values()
    assert not connection.features.use_metadata_id  # Cassandra
    for name in ("get", "get_all", "get_commented", "put_new"):
        plan = direct._plan(cql._prepared[name])
        values = plan.encode(("a", "b") if name.startswith("get") else ("a", "b", 1, 1))
        frame = ProtocolHandler.encode_message(
            direct._message(Call(((plan.prepared, values),)), [(values, plan)]),
            1,
            4,
            compressor=None,
            allow_beta_protocol_version=False,
            protocol_features=connection.features,
        )
        body = frame[9:]
        flags = body[2 + len(plan.prepared.query_id) + 2]  # [short bytes id][short cl][byte flags]
        assert not flags & SKIP_METADATA, name
    await cql.write("put", ("a", "b", 1, 10))
    assert await cql.read("get", ("a", "b")) == [{"c": 1, "v": 10}]
    assert await cql.read("get_all", ("a", "b")) == [{"a": "a", "b": "b", "c": 1, "v": 10}]
    # A column added after PREPARE is seen by the star reads (their metadata comes along).
    await cql.simple(f"ALTER TABLE {{ks}}.{cql.probe} ADD w text", timeout_s=30)  # type: ignore[attr-defined]
    await cql.simple(f"UPDATE {{ks}}.{cql.probe} SET w = 'x' WHERE a = 'a' AND b = 'b' AND c = 1")  # type: ignore[attr-defined]
    for name in ("get_all", "get_commented"):
        rows = await cql.read(name, ("a", "b"))
        assert rows == [{"a": "a", "b": "b", "c": 1, "v": 10, "w": "x"}], name


@pytest.mark.parametrize(
    ("table", "columns"), [("commits", COMMIT_COLUMNS), ("history", HISTORY_COLUMNS)]
)
async def test_the_backends_named_reads_name_every_column(
    scylla: ScyllaHarness, cql: CqlSession, table: str, columns: tuple[str, ...]
) -> None:
    """They replaced ``SELECT *``: a column a migration adds must be added to them."""
    rows = await cql.simple(
        "SELECT column_name FROM system_schema.columns"
        " WHERE keyspace_name = %s AND table_name = %s",
        (scylla.keyspace, table),
        raw=True,
    )
    assert sorted(columns) == sorted(r["column_name"] for r in rows)


async def test_the_backend_checks_every_statement_it_prepares_and_keeps_the_direct_path(
    scylla: ScyllaHarness,
) -> None:
    backend = await scylla.open()
    cql = store_of(backend)._cql
    assert cql.direct is not None and not backend.events
    frames = send_path.check_frames(cql.direct, cql._prepared.values(), [None])
    assert frames == 3 * len(cql._prepared) > 100


async def test_a_driver_part_that_breaks_at_run_time_turns_the_path_off_loudly(
    cql: CqlSession, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a silent hand-over per request: one warning, one event, then the driver."""

    def changed(*args: object, **kwargs: object) -> None:
        raise TypeError("encode() got an unexpected keyword argument")  # send_msg changed

    monkeypatch.setattr(direct_module, "encode_frame", changed)
    with caplog.at_level(logging.WARNING, logger="backends.scylla.session"):
        await cql.write("put", ("a", "b", 1, 10))
        await cql.write("put", ("a", "b", 2, 20))
    assert cql.direct is None and cql.events == {"direct_path_refused": 1}
    warned = [r for r in caplog.records if "direct send path is off" in r.getMessage()]
    assert len(warned) == 1 and "TypeError" in warned[0].getMessage()
    assert await cql.read("get", ("a", "b")) == [{"c": 1, "v": 10}, {"c": 2, "v": 20}]


async def test_a_pool_shut_down_between_the_check_and_the_borrow_hands_the_request_over(
    cql: CqlSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The borrow then raises ConnectionException ("Pool is shutdown"): nothing was
    sent, so the driver's path takes it (here the pool is back by then) instead of
    a conditional write reported unknown and a read unavailable."""
    pool = next(iter(cql._session._pools.values()))
    borrow = pool.borrow_connection
    calls: list[int] = []

    def shut_down_once(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) in (1, 3):  # the first borrow of each request: the direct path's
            raise ConnectionException("Pool for h is shutdown")
        return borrow(*args, **kwargs)

    direct = _direct(cql)
    monkeypatch.setattr(pool, "borrow_connection", shut_down_once)
    assert await cql.cas("put_new", ("a", "b", 1, 1))
    assert await cql.read("get", ("a", "b")) == [{"c": 1, "v": 1}]
    assert direct.passed["stream"] == 2 and cql.direct is direct and len(calls) == 4


async def _lag(seconds: float) -> float:
    """The worst lateness of a 20 ms tick over ``seconds`` (the loop's lag)."""
    loop = asyncio.get_running_loop()
    worst, tick = 0.0, 0.02
    for _ in range(int(seconds / tick)):
        before = loop.time()
        await asyncio.sleep(tick)
        worst = max(worst, loop.time() - before - tick)
    return worst


@pytest.mark.parametrize("path", ["direct", "driver"])
async def test_the_loop_stays_responsive_while_every_stream_of_the_connection_is_held(
    cql: CqlSession, path: str
) -> None:
    """The borrow used to wait on a threading.Condition on the loop thread, 2 s for
    the direct path and 2 s more for the driver's; nothing could free a stream
    meanwhile, so every RPC, deadline and health check stalled ~4 s."""
    if path == "driver":
        cql.direct = None
    pool = next(iter(cql._session._pools.values()))
    (connection,) = pool._connections.values()
    held: list[int] = []
    for _ in range(connection.max_request_id + 1):  # every stream, as requests would hold them
        try:
            held.append(pool.borrow_connection(timeout=0)[1])
        except NoConnectionsAvailable:
            break
    assert connection.in_flight == connection.max_request_id
    pending: list[asyncio.Task[object]] = [
        asyncio.create_task(cql.read("get", ("a", "other"))),
        asyncio.create_task(cql.cas("put_new", ("a", "b", 1, 1))),
    ]
    try:
        lag = await _lag(1.0)
        waiting = not any(task.done() for task in pending)  # for a stream, off the loop
    finally:
        for request_id in held:  # give the streams back: the waiting borrows get them
            with connection.lock:
                connection.request_ids.append(request_id)
            pool.return_connection(connection)
    assert lag < 1.0, lag  # the borrow alone used to hold it 2 s; generous for a busy box
    assert waiting
    read, applied = await asyncio.wait_for(asyncio.gather(*pending), timeout=10)
    assert read == [] and applied is True
    assert cql.off_loop.started == 2
    assert await cql.read("get", ("a", "b")) == [{"c": 1, "v": 1}]


async def test_rows_answers_reuse_parsed_metadata_and_still_see_a_schema_change(
    cql: CqlSession,
) -> None:
    """``results.py``: an answer whose metadata bytes were seen before skips the
    driver's metadata parse (collections, a tuple and a UDT here) and decodes the
    same rows; an ``ALTER`` changes the bytes, so the new column is seen."""
    table = f"{cql.probe}_meta"  # type: ignore[attr-defined]
    udt = f"{cql.probe}_pt"  # type: ignore[attr-defined]
    await cql.simple(f"CREATE TYPE {{ks}}.{udt} (x int, tags frozen<set<text>>)", timeout_s=30)
    await cql.simple(
        f"CREATE TABLE {{ks}}.{table} (a text PRIMARY KEY, m frozen<map<text, list<int>>>,"
        f" t tuple<int, text>, u frozen<{udt}>, s set<text>)",
        timeout_s=30,
    )
    try:
        await cql.prepare(
            {
                "meta_put": f"INSERT INTO {{ks}}.{table} (a, m, t, s) VALUES (?, ?, ?, ?)",
                "meta_new": f"INSERT INTO {{ks}}.{table} (a, s) VALUES (?, ?) IF NOT EXISTS",
                "meta_get": f"SELECT * FROM {{ks}}.{table} WHERE a = ?",
            }
        )
        await cql.simple(
            f"UPDATE {cql.keyspace}.{table} SET u = {{x: 7, tags: {{'p', 'q'}}}} WHERE a = 'k'",
            raw=True,
        )
        await cql.write("meta_put", ("k", {"one": [1, 2]}, (3, "three"), {"s1"}))
        cache = _direct(cql)._plan(cql._prepared["meta_get"]).results
        answers = [await cql.read("meta_get", ("k",)) for _ in range(3)]
        assert answers[0] == answers[1] == answers[2]
        (row,) = answers[0]
        assert row["m"] == {"one": [1, 2]} and row["t"] == (3, "three")
        assert row["u"].x == 7 and row["u"].tags == {"p", "q"} and row["s"] == {"s1"}
        assert cache.hits == 2
        lwt = _direct(cql)._plan(cql._prepared["meta_new"]).results
        assert [await cql.cas("meta_new", (key, {"x"})) for key in ("n1", "n2", "k", "k")] == [
            True,
            True,
            False,
            False,
        ]
        assert lwt.hits == 2  # [applied] alone, then [applied] with the row: one each
        await cql.simple(f"ALTER TABLE {{ks}}.{table} ADD w text", timeout_s=30)
        await cql.simple(f"UPDATE {{ks}}.{table} SET w = 'new' WHERE a = 'k'")
        (row,) = await cql.read("meta_get", ("k",))
        assert row["w"] == "new" and row["m"] == {"one": [1, 2]}
        assert cache.hits == 2
    finally:
        await cql.simple(f"DROP TABLE IF EXISTS {{ks}}.{table}", timeout_s=30)
        await cql.simple(f"DROP TYPE IF EXISTS {{ks}}.{udt}", timeout_s=30)
