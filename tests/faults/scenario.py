"""Shared pieces of the process-fault tests: the plan, its conversations, direct
backend connections, a crash-safe Cassandra node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from backends.scylla import open_scylla_backend
from service.client import CommitClient
from service.domain.ports import Backend
from tests.faults.load import LoadPlan
from tests.faults.support import OpenBackend, Service
from tests.servers import cql_server
from tests.servers.cql_server import Node
from tests.servers.redis_server import open_initialised

READER = "reader"
SENDERS = tuple(f"sender-{n}" for n in range(8))
CONVERSATIONS = tuple(f"conv-{n}" for n in range(4))


def plan(tenant: str, *, workers: int) -> LoadPlan:
    """The load of these tests: ``workers`` clients over 8 senders in 4 conversations."""
    return LoadPlan(tenant=tenant, conversations=CONVERSATIONS, senders=SENDERS, workers=workers)


async def create_conversations(service: Service, tenant: str) -> None:
    """Every conversation of the plan, with every sender and the reader as members."""
    async with CommitClient.connect(service.target) as client:
        for conversation in CONVERSATIONS:
            await client.create_conversation(tenant, conversation, [*SENDERS, READER])


def redis_backend(url: str, prefix: str) -> OpenBackend:
    """Opens a direct connection to the service's Redis data (the test's own)."""

    @asynccontextmanager
    async def open_backend() -> AsyncIterator[Backend]:
        backend = await open_initialised(url, prefix=prefix)
        try:
            yield backend
        finally:
            await backend.close()

    return open_backend


def scylla_backend(host: str, port: int, keyspace: str) -> OpenBackend:
    """Opens a direct connection to the service's keyspace (the test's own)."""

    @asynccontextmanager
    async def open_backend() -> AsyncIterator[Backend]:
        backend = await open_scylla_backend([host], port=port, keyspace=keyspace)
        try:
            yield backend
        finally:
            await backend.close()

    return open_backend


def start_batch_node(data_dir: Path) -> Node:
    """A started Cassandra node whose commit log is fsynced before every write is
    acknowledged (``commitlog_sync: batch``), so that kill -9 loses no acknowledged
    write; a failed start fails the test with the node's log tail."""
    launcher = cql_server._launcher()
    node: Node = launcher.CassandraNode(data_dir, commitlog_sync="batch")
    try:
        launcher.ensure_jars()
        node.start(cql_server.START_TIMEOUT_S)
    except launcher.CassandraError as exc:
        node.kill()
        pytest.fail(f"the Cassandra node of the fault test did not start:\n{exc}", pytrace=False)
    return node
