"""No message body, password, Redis URL or CQL password reaches a log line or an error text.

A realistic session runs against a password-protected redis-server: commits
with distinctive bodies and body references, replays, conflicts, strangers,
bad input, a recoverable failure, a crash finished by Resume, a lost reply,
an outage that turns readiness off (and back on). Everything logged in
process is captured at DEBUG (every logger, exceptions and their chains
formatted), and so is every gRPC answer a caller saw (messages, trailing
metadata, the readiness text). Then ``message-committer serve`` runs as a
subprocess at DEBUG: with a wrong Redis password (start-up fails), with the
right one (a session, then SIGTERM), and on the CQL backend with a user and
password (against the real node, and against a port where nothing listens).
Its whole stdout and stderr is searched as well.

Every case runs in both log formats (``MC_LOG_FORMAT=text|json``): in JSON
every line must parse as one object with the required keys, and in both no
line at INFO or above may name a sender or a client message id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import grpc
import pytest
from google.protobuf.message import Message
from grpc import aio
from grpc_health.v1 import health_pb2
from redis import Redis

from service.bootstrap import BackendUnreachable, build_server, open_backend
from service.domain.faults import FaultPoint, FaultPoints
from service.domain.ports import Backend
from service.gen.message_committer.v1 import committer_pb2 as pb
from service.gen.message_committer.v1 import membership_pb2 as mpb
from service.logformat import REQUIRED_KEYS, JsonFormatter
from tests.e2e.conftest import BASE_CONFIG, eventually, health_check, http_get
from tests.e2e.process import ServeProcess, run_cli
from tests.security.conftest import Failure, invoke, unique_tenant
from tests.servers.redis_server import RedisServer, initialise_now, initialise_prefix
from toolkit.campaign.faulty import CallFault, FaultyOutbox, FaultyStore
from toolkit.ports import free_port

pytestmark = pytest.mark.e2e

TAG = uuid.uuid4().hex[:16]
PASSWORD = f"redis-pass-{TAG}"
WRONG_PASSWORD = f"wrong-pass-{TAG}"
CQL_PASSWORD = f"cql-pass-{TAG}"
BODY = "SECRET-BODY-"
URI = "SECRET-URI-"
STEP_TIMEOUT_S = 15.0
LOG_FORMATS = ("text", "json")
LEVELS = logging.getLevelNamesMapping()
IDENTIFIERS: set[str] = set()
"""Every sender and cmid the sessions used (user() and cmid_of() add them)."""
_TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([A-Z]+) (\S+): ")


def redis_url(port: int, password: str) -> str:
    return f"redis://:{password}@127.0.0.1:{port}/0"


def require_password(server: RedisServer, password: str) -> None:
    """Turn on ``requirepass`` (not persisted: a restart comes back without it)."""
    with Redis(host="127.0.0.1", port=server.port, socket_timeout=5) as client:
        client.config_set("requirepass", password)


@pytest.fixture
def guarded_redis(own_redis_server: RedisServer) -> Iterator[RedisServer]:
    require_password(own_redis_server, PASSWORD)
    yield own_redis_server


@dataclass
class Seen:
    """Everything a caller or an operator saw; searched for secrets at the end."""

    texts: list[bytes] = field(default_factory=list)

    def add(self, text: str | bytes) -> None:
        self.texts.append(text if isinstance(text, bytes) else text.encode())

    def forbidden(self, *secrets: str) -> list[str]:
        """The secrets found anywhere in what was seen."""
        return [s for s in secrets if any(s.encode() in t for t in self.texts)]


def _log_line(record: logging.LogRecord, log_format: str) -> str:
    """``record`` as ``serve`` would write it in ``log_format`` (JSON: checked to parse)."""
    if log_format == "json":
        line = JsonFormatter().format(record)
        parsed = json.loads(line)
        assert set(REQUIRED_KEYS) <= set(parsed), line
        return line
    formatter = logging.Formatter()
    parts = [record.name, record.getMessage()]
    if record.exc_info:
        parts.append(formatter.formatException(record.exc_info))
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return "\n".join(parts)


def body(n: int) -> bytes:
    return f"{BODY}{n}-{TAG}".encode()


def user(name: str) -> str:
    """A distinctive user id (a sender must not be found in a log line by chance)."""
    IDENTIFIERS.add(f"{name}-{TAG[:8]}")
    return f"{name}-{TAG[:8]}"


def cmid_of(name: str) -> str:
    IDENTIFIERS.add(f"{name}-{TAG}")
    return f"{name}-{TAG}"


def send(tenant: str, cmid: str, content: bytes, sender: str = "alice") -> pb.CommitRequest:
    return pb.CommitRequest(
        send=pb.AuthenticatedSend(
            tenant=tenant,
            sender=user(sender),
            device="phone",
            conversation="c1",
            client_message_id=cmid_of(cmid),
            content=pb.MessageContent(message_type=pb.MESSAGE_TYPE_TEXT, inline_body=content),
        )
    )


@dataclass
class Session:
    channel: aio.Channel
    seen: Seen

    async def ok(self, rpc: str, request: Message) -> Message:
        answer = await invoke(self.channel, rpc, request)
        assert not isinstance(answer, Failure), f"{rpc}: {answer}"
        return answer

    async def fails(self, rpc: str, request: Message, code: grpc.StatusCode) -> Failure:
        answer = await invoke(self.channel, rpc, request)
        assert isinstance(answer, Failure), f"{rpc} succeeded: {answer}"
        assert answer.code == code, answer
        self.seen.add(answer.text())
        return answer


async def _readiness(session: Session, http: str) -> str:
    status, text = await http_get(f"{http}/readyz")
    session.seen.add(text)
    call = health_check(session.channel)(health_pb2.HealthCheckRequest(), timeout=5)
    await call
    for key, value in await call.trailing_metadata() or ():
        session.seen.add(f"{key}={value!r}")
    return f"{status} {text}"


@dataclass(frozen=True)
class Line:
    level: int
    logger: str
    text: str


def parse_output(output: str, log_format: str) -> list[Line]:
    """The records in what ``serve`` wrote; JSON: every line must be one object."""
    lines: list[Line] = []
    for raw in output.splitlines():
        if log_format == "json":
            parsed = json.loads(raw)
            assert isinstance(parsed, dict), raw
            assert all(isinstance(parsed.get(k), str) for k in REQUIRED_KEYS), raw
            level = LEVELS[parsed["level"]]
            lines.append(Line(level, parsed["logger"], raw))
            continue
        match = _TEXT_LINE.match(raw)
        if match:
            lines.append(Line(LEVELS[match[1]], match[2], raw))
        elif lines:  # a traceback's continuation belongs to the record above
            last = lines.pop()
            lines.append(Line(last.level, last.logger, last.text + "\n" + raw))
        else:
            lines.append(Line(logging.ERROR, "", raw))  # e.g. a start-up error
    return lines


def identifiers_at_info(lines: list[Line]) -> list[str]:
    """Lines at INFO or above (pending loggers aside) that name a sender or a cmid."""
    assert IDENTIFIERS, "no identifier was used: the check would be empty"
    return [
        line.text
        for line in lines
        if line.level >= logging.INFO and any(i in line.text for i in IDENTIFIERS)
    ]


@pytest.mark.redis
@pytest.mark.parametrize("log_format", LOG_FORMATS)
async def test_a_session_with_failures_leaks_nothing(
    guarded_redis: RedisServer, caplog: pytest.LogCaptureFixture, log_format: str
) -> None:
    caplog.set_level(logging.DEBUG)
    url = redis_url(guarded_redis.port, PASSWORD)
    config = replace(
        BASE_CONFIG,
        backend="redis",
        redis_url=url,
        redis_prefix=f"mc-sec-{TAG}",
        readiness_interval=0.1,
        readiness_timeout=0.5,
        log_level="DEBUG",
        log_format=log_format,
    )
    await initialise_prefix(url, config.redis_prefix)
    opened = await open_backend(config)
    store, outbox = FaultyStore(opened.store), FaultyOutbox(opened.outbox)
    backend = Backend(
        name=opened.name,
        store=store,
        membership=opened.membership,
        outbox=outbox,
        durable=opened.durable,
        closers=opened.closers,
        requests=opened.requests,
        delivery=opened.delivery,
    )
    faults = FaultPoints()
    server = build_server(config, backend, faults=faults)
    await server.start()
    http = f"http://127.0.0.1:{server.http_port}"
    seen = Seen()

    async def ready() -> bool:
        return server.probe.readiness.ready

    async def not_ready() -> bool:
        return not server.probe.readiness.ready

    t = unique_tenant()
    try:
        async with (
            asyncio.timeout(120),
            aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel,
        ):
            s = Session(channel, seen)
            await s.ok(
                "CreateConversation",
                mpb.CreateConversationRequest(
                    tenant=t, conversation="c1", members=[user("alice"), user("bob")]
                ),
            )
            await s.ok("Commit", send(t, "m-1", body(1)))
            await s.ok("Commit", send(t, "m-1", body(1)))  # a replay
            await s.fails("Commit", send(t, "m-1", body(2)), grpc.StatusCode.ALREADY_EXISTS)
            await s.fails(
                "Commit",
                send(t, "m-2", body(3), sender="mallory"),
                grpc.StatusCode.PERMISSION_DENIED,
            )
            await s.fails(
                "Commit", send(t, "m-3", body(4) * 5000), grpc.StatusCode.INVALID_ARGUMENT
            )
            bad_ref = send(t, "m-4", b"")
            bad_ref.send.content.body_ref.CopyFrom(
                pb.BodyReference(uri=f"s3://{URI}{TAG}", size_bytes=1, sha256="NOT-HEX")
            )
            await s.fails("Commit", bad_ref, grpc.StatusCode.INVALID_ARGUMENT)

            # A recoverable failure, answered UNAVAILABLE; the same request finishes it.
            store.inject("reserve", CallFault.FAIL)
            await s.fails("Commit", send(t, "m-5", body(5)), grpc.StatusCode.UNAVAILABLE)
            await s.ok("Commit", send(t, "m-5", body(5)))
            # A crash after put_record (INTERNAL), finished by Resume.
            faults.arm(FaultPoint.AFTER_PUT_RECORD)
            await s.fails("Commit", send(t, "m-6", body(6)), grpc.StatusCode.INTERNAL)
            resume = pb.ResumeRequest(
                tenant=t, sender=user("alice"), client_message_id=cmid_of("m-6"), conversation="c1"
            )
            await s.ok("Resume", resume)
            # A lost reply: the committer re-reads and converges.
            store.inject("mark_published_and_committed", CallFault.LOSE_REPLY)
            await s.ok("Commit", send(t, "m-7", body(7)))
            page = await s.ok(
                "History", pb.HistoryRequest(tenant=t, conversation="c1", actor=user("bob"))
            )
            assert isinstance(page, pb.HistoryResponse) and len(page.page.records) == 4

            # An outage: readiness fails, calls are UNAVAILABLE; then it comes back.
            await asyncio.to_thread(guarded_redis.stop)
            await eventually(not_ready, STEP_TIMEOUT_S)
            assert (await _readiness(s, http)).startswith("503 redis backend not ready")
            await s.fails("Commit", send(t, "m-8", body(8)), grpc.StatusCode.UNAVAILABLE)
            history = pb.HistoryRequest(tenant=t, conversation="c1", actor=user("bob"))
            await s.fails("History", history, grpc.StatusCode.UNAVAILABLE)
            await asyncio.to_thread(guarded_redis.start)
            await asyncio.to_thread(require_password, guarded_redis, PASSWORD)
            await eventually(ready, STEP_TIMEOUT_S)
            assert (await _readiness(s, http)).startswith("200 ready")
            await s.ok("Commit", send(t, "m-8", body(8)))
            await s.ok("RecoverDue", pb.RecoverDueRequest())
    finally:
        await server.stop(grace_s=0.5)

    lines = []
    for record in caplog.records:
        text = _log_line(record, log_format)
        seen.add(text)
        lines.append(Line(record.levelno, record.name, text))
    assert len(caplog.records) > 5, "nothing was logged: the capture is not working"
    assert any("readiness" in r.getMessage() for r in caplog.records)
    assert seen.forbidden(PASSWORD, url, BODY, URI, "redis://") == []
    assert identifiers_at_info(lines) == []


@dataclass(frozen=True)
class Run:
    code: int
    output: str


def serve_once(args: list[str], env: dict[str, str]) -> Run:
    """``serve`` that must stop by itself (a failed start-up), with everything it printed."""
    done: subprocess.CompletedProcess[str] = run_cli(["serve", *args], env=env)
    return Run(done.returncode, done.stdout + done.stderr)


@pytest.mark.redis
@pytest.mark.parametrize("log_format", LOG_FORMATS)
def test_serve_with_a_wrong_redis_password_fails_without_leaking(
    guarded_redis: RedisServer, log_format: str
) -> None:
    url = redis_url(guarded_redis.port, WRONG_PASSWORD)
    run = serve_once(
        ["--backend", "redis", "--log-level", "DEBUG", "--grpc-address", "127.0.0.1:0"],
        {"MC_REDIS_URL": url, "MC_HTTP_ADDRESS": "127.0.0.1:0", "MC_LOG_FORMAT": log_format},
    )
    assert run.code == 3, run.output
    parse_output(run.output, log_format)
    assert "cannot open the redis backend (1 host)" in run.output
    for secret in (WRONG_PASSWORD, url, "redis://", str(guarded_redis.port)):
        assert secret not in run.output, f"serve printed {secret!r}"


async def _serve_session(target: str, tenant: str) -> list[bytes]:
    """Commits, a replay, a conflict and a stranger against a ``serve`` process."""
    seen: list[bytes] = []
    async with aio.insecure_channel(target) as channel:
        s = Session(channel, Seen(seen))
        await s.ok(
            "CreateConversation",
            mpb.CreateConversationRequest(
                tenant=tenant, conversation="c1", members=[user("alice")]
            ),
        )
        for n in (11, 12, 13):
            await s.ok("Commit", send(tenant, f"p-{n}", body(n)))
        await s.ok("Commit", send(tenant, "p-11", body(11)))
        await s.fails("Commit", send(tenant, "p-11", body(14)), grpc.StatusCode.ALREADY_EXISTS)
        await s.fails(
            "Commit",
            send(tenant, "p-15", body(15), sender="eve"),
            grpc.StatusCode.PERMISSION_DENIED,
        )
    return seen


def _serve_and_stop(
    args: list[str], env: dict[str, str], log_format: str
) -> tuple[str, list[bytes]]:
    """A session against ``serve`` at DEBUG in ``log_format``; its whole output
    (every line checked to parse as JSON in that format, none naming a sender or
    a cmid at INFO or above) and what the caller was answered."""
    process = ServeProcess(["--log-level", "DEBUG", "--log-format", log_format, *args], env=env)
    try:
        seen = asyncio.run(asyncio.wait_for(_serve_session(process.target, unique_tenant()), 60))
        assert process.terminate() == 0
        log = process.log()
    finally:
        process.close()
    lines = parse_output(log, log_format)
    assert len(lines) > 3, log
    assert identifiers_at_info(lines) == []
    return log, seen


@pytest.mark.redis
@pytest.mark.parametrize("log_format", LOG_FORMATS)
def test_serve_on_redis_with_a_password_logs_no_secret(
    guarded_redis: RedisServer, log_format: str
) -> None:
    url = redis_url(guarded_redis.port, PASSWORD)
    initialise_now(url, f"mc-sec-{TAG}")
    log, answers = _serve_and_stop(
        ["--backend", "redis"],
        {"MC_REDIS_URL": url, "MC_REDIS_PREFIX": f"mc-sec-{TAG}"},
        log_format,
    )
    assert "backend redis opened (1 host(s))" in log and "DEBUG" in log
    for secret in (PASSWORD, url, "redis://", BODY):
        assert secret not in log, f"serve logged {secret!r}"
        assert not any(secret.encode() in a for a in answers)


@pytest.mark.scylla
@pytest.mark.parametrize("log_format", LOG_FORMATS)
def test_serve_on_scylla_with_a_password_logs_no_secret(
    cql_contact: tuple[str, int], cql_keyspace: str, log_format: str
) -> None:
    host, port = cql_contact
    env = {"MC_SCYLLA_PASSWORD": CQL_PASSWORD, "MC_SCYLLA_USERNAME": "mc-user"}
    args = [
        "--backend",
        "scylla",
        "--scylla-contact-points",
        host,
        "--scylla-port",
        str(port),
        "--scylla-keyspace",
        cql_keyspace,
    ]
    log, answers = _serve_and_stop(args, env, log_format)
    assert "backend scylla opened (1 host(s))" in log and "DEBUG" in log
    for secret in (CQL_PASSWORD, BODY):
        assert secret not in log, f"serve logged {secret!r}"
        assert not any(secret.encode() in a for a in answers)


@pytest.mark.scylla
@pytest.mark.own_cql  # no node at all
@pytest.mark.parametrize("log_format", LOG_FORMATS)
def test_serve_with_an_unreachable_cql_node_fails_without_leaking(log_format: str) -> None:
    port = free_port()  # a port nothing listens on
    run = serve_once(
        [
            "--backend",
            "scylla",
            "--scylla-contact-points",
            "127.0.0.1",
            "--scylla-port",
            str(port),
            "--log-level",
            "DEBUG",
            "--grpc-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
        ],
        {
            "MC_SCYLLA_USERNAME": "mc-user",
            "MC_SCYLLA_PASSWORD": CQL_PASSWORD,
            "MC_LOG_FORMAT": log_format,
        },
    )
    assert run.code == 3, run.output
    parse_output(run.output, log_format)
    assert CQL_PASSWORD not in run.output


def test_open_backend_errors_name_no_secret() -> None:
    """The StartupError text itself (what serve prints) for a bad Redis URL."""
    config = replace(BASE_CONFIG, backend="redis", redis_url=f"redis://:{PASSWORD}@127.0.0.1:1/0")
    with pytest.raises(BackendUnreachable) as caught:
        asyncio.run(open_backend(config))
    assert PASSWORD not in str(caught.value) and "redis://" not in str(caught.value)
