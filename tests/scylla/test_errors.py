"""Errors cross the boundary as StoreErrors that name no host, credential, CQL or body."""

from __future__ import annotations

import dataclasses

import pytest
from cassandra import ConsistencyLevel, ReadTimeout

from backends.scylla import open_scylla_backend
from backends.scylla.session import Row, Send
from service.domain.errors import (
    IdempotencyConflict,
    StoreConflict,
    StoreInvalid,
    StoreUnavailable,
)
from service.domain.model import (
    FrozenDeliveryInput,
    MessageContent,
    MessageType,
    ReserveCandidate,
    Reserved,
)
from tests.scylla.conftest import store_of
from tests.servers.cql_server import ScyllaHarness
from tests.support import committer, conversation, send, unique
from toolkit.ports import free_port

pytestmark = [pytest.mark.scylla, pytest.mark.own_cql]  # cases with no node; the rest ask for one

SECRETS = ("mc-user-4711", "pw-very-secret-0815")


def _closed_port() -> int:
    return free_port()  # reserved: nothing of ours will listen there


def _clean(text: str, *forbidden: str) -> None:
    for word in forbidden:
        assert word not in text


async def test_a_failed_connection_names_no_host_and_no_credential() -> None:
    port = _closed_port()
    with pytest.raises(StoreUnavailable) as caught:
        await open_scylla_backend(
            ["127.0.0.1"],
            port=port,
            username=SECRETS[0],
            password=SECRETS[1],
            request_timeout_s=2.0,
        )
    text = str(caught.value)
    _clean(text, "127.0.0.1", str(port), *SECRETS)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_bad_settings_are_refused_before_connecting() -> None:
    with pytest.raises(StoreInvalid):
        await open_scylla_backend(["127.0.0.1"], consistency="MOST")
    with pytest.raises(StoreInvalid):
        await open_scylla_backend(["127.0.0.1"], serial_consistency="QUORUM")
    with pytest.raises(StoreInvalid):
        await open_scylla_backend(["127.0.0.1"], keyspace="drop table x;")


async def test_driver_failures_and_conflicts_say_nothing_about_cql_or_bodies(
    scylla: ScyllaHarness, cql_contact: tuple[str, int]
) -> None:
    backend = await scylla.open()
    tenant = unique("t")
    await conversation(backend, tenant)
    body = b"top-secret-message-body"
    req = send(tenant, content=MessageContent(MessageType.TEXT, body))

    async def read_timeout(name: str, send_it: Send) -> list[Row]:
        if name == "c.get":
            raise ReadTimeout("injected", consistency=ConsistencyLevel.LOCAL_QUORUM)
        return await send_it()

    store_of(backend).cql.interceptor = read_timeout
    with pytest.raises(StoreUnavailable) as unavailable:
        await backend.store.load_commit(req.key, "c1")
    store_of(backend).cql.interceptor = None
    c = committer(backend)
    await c.commit_send(req)
    other = send(tenant, cmid=req.cmid, content=MessageContent(MessageType.TEXT, b"other"))
    with pytest.raises(IdempotencyConflict) as conflict:
        await c.commit_send(other)
    reserved = await backend.store.reserve(
        send(tenant), FrozenDeliveryInput(("alice", "bob"), 1), ReserveCandidate("m-x", 1)
    )
    assert isinstance(reserved, Reserved)
    forged_record = dataclasses.replace(
        reserved.intent.record, content=MessageContent(MessageType.TEXT, body)
    )
    with pytest.raises(StoreConflict) as refused:
        await backend.store.put_record(dataclasses.replace(reserved.intent, record=forged_record))
    for exc in (unavailable.value, conflict.value, refused.value):
        _clean(str(exc), body.decode(), "SELECT", "UPDATE", "commits", cql_contact[0], tenant)
