"""Traces of a real ``serve`` process, received by a real OTLP receiver.

Each case runs ``message-committer serve`` with ``OTEL_EXPORTER_OTLP_ENDPOINT``
pointing at ``tests.e2e.otlp.OtlpReceiver``, commits over real gRPC (a fresh
send, its replay, a conflicting reuse), stops the process with SIGTERM and
reads what was exported: the Commit server span, the store/membership/outbox
spans under it, and the Redis command or CQL request spans under those. Every
span is then searched for what must never leave the process (the body, the
sender, the cmid, the Redis password and URL, the backend's host and port),
and its attribute keys are held to the documented allow-list.

On memory the same process logs in JSON: every line parses, and the access
line of the Commit carries the trace and span ids of its server span. Tracing
off imports nothing of OpenTelemetry; an endpoint without the extra installed
stops start-up.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc import aio
from redis import Redis

from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import committer_pb2_grpc, membership_pb2_grpc
from service.gen.message_committer.v1 import membership_pb2 as mpb
from service.logformat import REQUIRED_KEYS
from tests.e2e.otlp import (
    CLIENT,
    INTERNAL,
    SERVER,
    OtlpReceiver,
    ReceivedSpan,
    otlp_receiver,
    tracing_env,
)
from tests.e2e.process import ServeProcess
from tests.servers.redis_server import RedisServer

pytestmark = pytest.mark.e2e

TAG = uuid.uuid4().hex[:10]
BODY = f"TRACE-BODY-{TAG}".encode()
SENDER = f"alice{TAG}"
CMID = f"cm-{TAG}"
PASSWORD = f"trace-pass-{TAG}"
COMMIT = "/message_committer.v1.MessageCommitterService/Commit"
ALLOWED_KEYS = {
    "rpc.system",
    "rpc.service",
    "rpc.method",
    "rpc.grpc.status_code",
    "db.system",
    "db.system.name",
    "mc.backend",
    "mc.operation",
    "mc.cql.statement",
}
"""The attribute keys docs/operating.md promises are the only ones exported."""
RECORDED_BY_INSTRUMENTATIONS = {
    "net.peer.ip",
    "net.peer.name",
    "net.peer.port",
    "server.address",
    "server.port",
    "rpc.user_agent",
    "db.statement",
    "db.query.text",
    "db.redis.database_index",
}
"""What opentelemetry-instrumentation-grpc/-redis set on these very spans before the scrubber."""


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as r:
        yield r


async def _session(target: str, tenant: str) -> None:
    """A fresh commit, its replay, and a conflicting reuse of its key."""
    async with aio.insecure_channel(target) as channel:
        admin = membership_pb2_grpc.ConversationMembershipServiceStub(channel)
        await admin.CreateConversation(
            mpb.CreateConversationRequest(tenant=tenant, conversation="c1", members=[SENDER]),
            timeout=10,
        )
        stub = committer_pb2_grpc.MessageCommitterServiceStub(channel)
        send = pb.AuthenticatedSend(
            tenant=tenant,
            sender=SENDER,
            device="phone",
            conversation="c1",
            client_message_id=CMID,
            content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=BODY),
        )
        await stub.Commit(pb.CommitRequest(send=send), timeout=10)
        await stub.Commit(pb.CommitRequest(send=send), timeout=10)
        send.content.inline_body = BODY + b"-other"
        with pytest.raises(aio.AioRpcError) as conflict:
            await stub.Commit(pb.CommitRequest(send=send), timeout=10)
        assert conflict.value.code() is grpc.StatusCode.ALREADY_EXISTS


@dataclass
class Traced:
    spans: list[ReceivedSpan]
    log: str

    def fresh_commit(self) -> ReceivedSpan:
        """The server span of the first Commit (the one that wrote the record)."""
        commits = sorted(
            (s for s in self.spans if s.kind == SERVER and s.name == COMMIT),
            key=lambda s: s.start_ns,
        )
        assert len(commits) == 3, [s.name for s in self.spans]
        return commits[0]

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.parent_span_id == parent.span_id]


def _run(receiver: OtlpReceiver, args: list[str], env: dict[str, str]) -> Traced:
    process = ServeProcess(["--log-level", "DEBUG", *args], env={**tracing_env(receiver), **env})
    try:
        asyncio.run(asyncio.wait_for(_session(process.target, f"tr-{uuid.uuid4().hex[:8]}"), 60))
        receiver.wait_for(lambda spans: sum(s.name == COMMIT for s in spans) >= 3)
        assert process.terminate() == 0
        return Traced(receiver.spans(), process.log())
    finally:
        process.close()


def _check_commit_trace(traced: Traced, backend: str) -> dict[str, ReceivedSpan]:
    """The fresh commit's trace: its steps under the server span; returns them by name."""
    server = traced.fresh_commit()
    assert server.attributes["rpc.method"] == "Commit"
    assert server.attributes["rpc.grpc.status_code"] == 0
    steps = {s.name: s for s in traced.children(server)}
    if backend in ("redis", "memory"):
        # Admission inside reserve, the rest in one pipelined call, tracing on or
        # off (issue 27): tracing shows what a commit sends, it does not change it
        assert set(steps) == {"MessageStore.reserve", "MessageStore.finish_pipelined"}, steps
    else:
        for name in (
            "MembershipStore.admission",
            "MessageStore.reserve",
            "MessageStore.put_record",
            "Outbox.publish",
        ):
            assert name in steps, f"{name} not under the Commit span: {sorted(steps)}"
        marks = {"MessageStore.mark_published_and_committed", "MessageStore.mark_committed"}
        assert marks & set(steps), sorted(steps)
    for step in steps.values():
        assert step.kind == INTERNAL and step.trace_id == server.trace_id
        assert step.attributes["mc.backend"] == backend
        assert step.name.endswith("." + step.attributes["mc.operation"])
    conflict = sorted((s for s in traced.spans if s.name == COMMIT), key=lambda s: s.start_ns)[-1]
    assert conflict.attributes["rpc.grpc.status_code"] == grpc.StatusCode.ALREADY_EXISTS.value[0]
    return steps


def _check_scrubbed(traced: Traced, *secrets: str) -> None:
    assert traced.spans
    for span in traced.spans:
        keys = set(span.attributes)
        assert keys <= ALLOWED_KEYS, f"{span.name}: {keys - ALLOWED_KEYS}"
        assert not keys & RECORDED_BY_INSTRUMENTATIONS
        for _, attributes in span.events:
            assert set(attributes) <= {"exception.type", "exception.escaped"}, span.name
        texts = "\n".join(span.texts())
        for secret in (BODY.decode(), SENDER, CMID, "127.0.0.1", *secrets):
            assert secret not in texts, f"{span.name} carries {secret!r}"
    assert {s.resource.get("service.name") for s in traced.spans} == {"mc-under-test"}


def test_a_commit_on_memory_is_one_trace_and_its_json_log_names_it(
    receiver: OtlpReceiver,
) -> None:
    traced = _run(receiver, ["--backend", "memory"], {"MC_LOG_FORMAT": "json"})
    _check_commit_trace(traced, "memory")
    _check_scrubbed(traced)
    assert not [s for s in traced.spans if s.name.startswith("/grpc.health")], "probes traced"

    lines = [json.loads(line) for line in traced.log.splitlines()]
    assert lines and all(isinstance(line, dict) for line in lines)
    for line in lines:
        assert all(isinstance(line.get(k), str) for k in REQUIRED_KEYS), line
    server = traced.fresh_commit()
    access = [
        line
        for line in lines
        if line["logger"] == "service.api.interceptor" and "/Commit OK" in line["message"]
    ]
    assert access, "no access line for the Commit"
    assert {"trace_id": server.trace_id, "span_id": server.span_id}.items() <= access[0].items()
    assert any("tracing on" in line["message"] for line in lines)


@pytest.mark.redis
def test_a_commit_on_redis_has_command_spans_without_address_or_password(
    receiver: OtlpReceiver, own_redis_server: RedisServer
) -> None:
    with Redis(host="127.0.0.1", port=own_redis_server.port, socket_timeout=5) as client:
        client.config_set("requirepass", PASSWORD)
    url = f"redis://:{PASSWORD}@127.0.0.1:{own_redis_server.port}/0"
    traced = _run(receiver, ["--backend", "redis"], {"MC_REDIS_URL": url})
    steps = _check_commit_trace(traced, "redis")
    for name in ("MessageStore.reserve", "MessageStore.finish_pipelined"):
        commands = traced.children(steps[name])
        assert commands, f"no Redis command under {name}"
        for command in commands:
            assert command.kind == CLIENT and command.attributes["db.system"] == "redis"
            assert command.name.isupper(), command.name  # the command, never its arguments
    _check_scrubbed(traced, PASSWORD, url, "redis://", str(own_redis_server.port))


@pytest.mark.scylla
def test_a_commit_on_scylla_has_cql_request_spans(
    receiver: OtlpReceiver, cql_contact: tuple[str, int], cql_keyspace: str
) -> None:
    host, port = cql_contact
    args = ["--backend", "scylla", "--scylla-contact-points", host]
    args += ["--scylla-port", str(port), "--scylla-keyspace", cql_keyspace]
    traced = _run(receiver, args, {})
    steps = _check_commit_trace(traced, "scylla")
    requests = traced.children(steps["MessageStore.reserve"])
    assert requests, "no CQL request under MessageStore.reserve"
    for request in requests:
        assert request.kind == CLIENT and request.attributes["db.system"] == "cassandra"
        assert request.name == "CQL " + request.attributes["mc.cql.statement"]
        assert request.start_ns >= steps["MessageStore.reserve"].start_ns
    _check_scrubbed(traced, cql_keyspace, f":{port}")


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_tracing_off_imports_no_opentelemetry() -> None:
    """A whole server, built and serving a commit, with no endpoint set."""
    code = """
import asyncio, sys
from backends.memory import open_memory_backend
from service.bootstrap import build_server
from service.config import ServiceConfig
from service.tracing import from_environment

async def main():
    tracing = from_environment({})
    config = ServiceConfig(backend="memory", grpc_address="127.0.0.1:0", http_address="127.0.0.1:0")
    server = build_server(config, open_memory_backend(), tracing=tracing)
    await server.start()
    await server.stop(0.1)
    return tracing.enabled

assert asyncio.run(main()) is False
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m == "service.otel")
print(loaded)
"""
    done = _python(code, {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_endpoint_without_the_otel_extra_stops_start_up() -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from service.cli import main
sys.exit(main(["serve", "--backend", "memory", "--grpc-address", "127.0.0.1:0"]))
"""
    env = {"PATH": "/usr/bin:/bin", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
    done = _python(code, env)
    assert done.returncode == 2, done.stderr
    assert "the otel extra is not installed" in done.stderr
    assert "127.0.0.1:1" not in done.stderr
