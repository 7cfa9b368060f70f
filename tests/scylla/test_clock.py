"""A replica whose clock is too far from the cluster's refuses to serve (DESIGN §12).

Scylla decides expiry by the replica's clock, so ``open_scylla_backend``
measures it against the coordinator's time and refuses beyond
``max_clock_skew_ms``; readiness checks again. A correct replica beside a
refused one keeps serving and replaying the original ACKs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from dataclasses import dataclass

import grpc
import pytest
from grpc import aio

from backends.scylla import open_scylla_backend
from backends.scylla.skew import measure
from service.api import convert, errors
from service.bootstrap import BackendUnreachable, build_server, open_backend, replica_clock
from service.config import ServiceConfig
from service.domain.errors import Recoverable, StoreMisconfigured
from service.domain.ports import Backend, Clock, OffsetClock, SystemClock
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, unique

pytestmark = pytest.mark.scylla

DAY_MS = 86_400_000
MAX_POLLS = 600


@dataclass
class AdjustableClock:
    """The wall clock plus an offset a test changes (a host whose time jumps)."""

    offset_ms: int = 0

    def now_ms(self) -> int:
        return SystemClock().now_ms() + self.offset_ms


async def _open(scylla: ScyllaHarness, clock: Clock) -> Backend:
    return await open_scylla_backend(
        [scylla.host], port=scylla.port, keyspace=scylla.keyspace, clock=clock,
        namespace=scylla.namespace, max_clock_skew_ms=3000,
    )  # fmt: skip


async def test_a_skewed_replica_refuses_and_a_correct_one_keeps_its_acks(
    scylla: ScyllaHarness,
) -> None:
    good = await _open(scylla, SystemClock())
    try:
        offset = await measure(store_of(good).cql, SystemClock(), 5)
        assert abs(offset.offset_ms) < 1000 and offset.uncertainty_ms < 1000
        tenant = unique("t")
        await conversation(good, tenant)
        request = send(tenant)
        ack = await committer(good).commit_send(request)
        for skew_ms in (10_000, -10_000, 2 * 86_400_000):
            with pytest.raises(StoreMisconfigured) as refused:
                await _open(scylla, OffsetClock(skew_ms))
            assert "NTP" in refused.value.operator_hint
            assert scylla.host not in str(refused.value)
        await good.store.readiness()
        assert await committer(good).commit_send(request) == ack
    finally:
        await good.close()


async def test_the_replica_exports_the_offset_it_measured_also_when_it_refuses(
    scylla: ScyllaHarness,
) -> None:
    """``message_committer_backend_clock_offset_seconds`` is the cluster's clock minus
    this replica's as the skew guard last measured it; a replica that drifted beyond the
    bound shows the offset it refused for."""
    clock = AdjustableClock(offset_ms=1_500)
    backend = await _open(scylla, clock)
    config = ServiceConfig(backend="scylla", grpc_address="127.0.0.1:0")
    server = build_server(config, backend, clock=clock)
    gauge = "message_committer_backend_clock_offset_seconds"
    try:
        offset = server.metrics.registry.get_sample_value(gauge)
        assert offset is not None and -2.0 < offset < -1.0
        clock.offset_ms = 10_000
        with pytest.raises(StoreMisconfigured):
            await backend.store.readiness()
        offset = server.metrics.registry.get_sample_value(gauge)
        assert offset is not None and -10.5 < offset < -9.5
    finally:
        await backend.close()


async def test_readiness_refuses_once_the_clock_drifts_and_recovers_with_it(
    scylla: ScyllaHarness,
) -> None:
    clock = AdjustableClock()
    backend = await _open(scylla, clock)
    try:
        await backend.store.readiness()
        clock.offset_ms = -8_000
        with pytest.raises(StoreMisconfigured):
            await backend.store.readiness()
        with pytest.raises(StoreMisconfigured):
            await backend.outbox.readiness()
        clock.offset_ms = 500  # within the bound
        await backend.store.readiness()
    finally:
        await backend.close()


async def test_the_service_refuses_to_start_with_a_skewed_clock(scylla: ScyllaHarness) -> None:
    config = ServiceConfig(
        backend="scylla",
        scylla_contact_points=(scylla.host,),
        scylla_port=scylla.port,
        scylla_keyspace=scylla.keyspace,
        test_clock_offset=30.0,
    )
    with pytest.raises(BackendUnreachable) as refused:
        await open_backend(config, replica_clock(config))
    assert "StoreMisconfigured" in str(refused.value) and "clock" in str(refused.value)
    # how far off, so an operator (and the nemesis's proof) reads the skew it refused for
    said = r"clock is 30\.\ds ahead of the cluster's \(allowed 3\.0s\)"
    assert re.search(said, str(refused.value))
    assert scylla.host not in str(refused.value)
    backend = await open_backend(dataclasses.replace(config, test_clock_offset=0.0))
    await backend.close()


async def test_a_clock_that_jumps_after_open_never_re_reserves_an_acked_key(
    scylla: ScyllaHarness,
) -> None:
    """Issue 24 item 3: expiry is judged by this replica's clock; a jump of 8 days
    after open (before the next probe) made the ACKed key look expired and
    ``reserve_over`` gave it a new seq. The skew bound is checked first now."""
    clock = AdjustableClock()
    backend = await _open(scylla, clock)
    try:
        tenant = unique("t")
        await conversation(backend, tenant)
        c = committer(backend, clock)
        request = send(tenant)
        ack = await c.commit_send(request)
        clock.offset_ms = 8 * 86_400_000  # past the 7-day idempotency window
        with pytest.raises(Recoverable):
            await c.commit_send(request)
        clock.offset_ms = 0
        assert await c.commit_send(request) == ack
    finally:
        await backend.close()


async def test_a_clock_8_days_ahead_after_start_refuses_writes_fail_closed(
    scylla: ScyllaHarness,
) -> None:
    """Issue 24 items 2 and 9: the real bound case. A serving replica's clock jumps
    8 days ahead (past the 7-day window, far past the 3 s skew bound): the next
    readiness probe closes the gate, and every write is refused UNAVAILABLE with
    reason FAIL_CLOSED (not only health), nothing written; back in time, the
    gate opens and the ACKed send replays its ACK."""
    clock = AdjustableClock()
    backend = await _open(scylla, clock)
    config = ServiceConfig(
        backend="scylla", grpc_address="127.0.0.1:0", http_address="127.0.0.1:0",
        readiness_interval=0.05, recovery_interval=3600.0, sender_rate_per_s=0.0,
    )  # fmt: skip
    server = build_server(config, backend, clock=clock)
    await server.start()
    tenant = unique("t")
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            commits = committer_pb2_grpc.MessageCommitterServiceStub(channel)
            await conversation(backend, tenant)
            acked = pb.CommitRequest(send=convert.send_to_proto(send(tenant, cmid="acked")))
            first = (await commits.Commit(acked, timeout=10)).message

            clock.offset_ms = 8 * DAY_MS
            for _ in range(MAX_POLLS):  # the probe that measures the clock closes the gate
                if "StoreMisconfigured" in server.probe.readiness.reason:
                    break
                await asyncio.sleep(0.05)
            fresh = pb.CommitRequest(send=convert.send_to_proto(send(tenant, cmid="fresh")))
            for request in (acked, fresh):
                with pytest.raises(aio.AioRpcError) as refused:
                    await commits.Commit(request, timeout=10)
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                trailer = refused.value.trailing_metadata()
                assert errors.parse_details(trailer).reason == "FAIL_CLOSED"  # type: ignore[arg-type]
                assert "StoreMisconfigured" in (refused.value.details() or "")
            rows = await store_of(backend).cql.simple(
                "SELECT cmid FROM {ks}.commits WHERE tenant = %s AND sender = %s AND cmid = %s",
                (tenant, "alice", "fresh"),
            )
            assert list(rows) == []  # nothing written

            clock.offset_ms = 0
            for _ in range(MAX_POLLS):  # the next successful probe opens the gate
                if server.probe.readiness.ready:
                    break
                await asyncio.sleep(0.05)
            assert (await commits.Commit(acked, timeout=10)).message == first
            assert (await commits.Commit(fresh, timeout=10)).message.seq == first.seq + 1
    finally:
        await server.stop(grace_s=0.5)
