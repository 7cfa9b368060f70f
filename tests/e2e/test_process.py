"""The real ``message-committer`` command: serve, client commands, start-up failures, SIGTERM."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2

from service.client import CommitClient
from service.domain.errors import Unavailable
from tests.e2e.conftest import health_watch, http_get
from tests.e2e.process import ServeProcess, run_cli
from tests.e2e.slow_serve import STARTED
from tests.support import send
from toolkit.ports import free_port

pytestmark = pytest.mark.e2e

SECRET = "hunter2-do-not-log"
SECRET_ENV = {
    "MC_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:1/0",
    "MC_SCYLLA_PASSWORD": SECRET,
}


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    process = ServeProcess(env=SECRET_ENV)
    try:
        yield process
    finally:
        process.close()


def test_a_newcomer_sees_a_commit_a_replay_and_a_conflict(serve: ServeProcess) -> None:
    t = ["--target", serve.target, "--tenant", "t1", "--conversation", "c1"]
    created = run_cli(["conversation", "create", *t, "--member", "alice", "--member", "bob"])
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "conversation=c1 version=1 members=2"

    message = ["send", *t, "--sender", "alice", "--device", "phone", "--cmid", "m-1"]
    first = run_cli([*message, "--text", "hi"])
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("committed  conversation=c1 seq=1 ")
    replay = run_cli([*message, "--text", "hi"])
    assert replay.stdout == first.stdout  # the same ACK, byte for byte
    conflict = run_cli([*message, "--text", "hi, edited"])
    assert conflict.returncode == 1
    assert conflict.stderr.startswith("error: ALREADY_EXISTS IdempotencyConflict: ")

    history = run_cli(["history", *t, "--actor", "bob"])
    assert history.returncode == 0 and history.stdout.count("'hi'") == 1
    members = run_cli(["conversation", "members", *t, "--json"])
    assert (
        members.stdout.strip()
        == '{"conversation": "c1", "members": ["alice", "bob"], "version": 1}'
    )
    resumed = run_cli(["resume", *t, "--sender", "alice", "--cmid", "m-1"])
    assert resumed.stdout == first.stdout
    recovered = run_cli(["recover", "--target", serve.target]).stdout.strip()
    assert recovered == "scanned=0  recovered=0  failed=0  quarantined=0"
    assert run_cli(["health", "--target", serve.target]).stdout.strip() == (
        "service=(server)  status=SERVING"
    )


def test_sigterm_shuts_down_cleanly_and_logs_no_secret(serve: ServeProcess) -> None:
    assert serve.terminate() == 0
    log = serve.log()
    assert "WARNING service.bootstrap: the memory backend is NOT durable" in log
    assert "shutdown requested" in log and "INFO service.server: stopped" in log
    assert SECRET not in log and "redis://" not in log


async def test_sigterm_turns_health_not_serving_and_lets_in_flight_rpcs_finish() -> None:
    process = ServeProcess(argv0=[sys.executable, "-m", "tests.e2e.slow_serve"])
    try:
        async with CommitClient.connect(process.target) as client:
            await client.create_conversation("t1", "slow", ["alice"])
            async with aio.insecure_channel(process.target) as channel:
                watch = health_watch(channel)(health_pb2.HealthCheckRequest())
                stream = aiter(watch)
                assert (await anext(stream)).status == health_pb2.HealthCheckResponse.SERVING
                in_flight = asyncio.create_task(
                    client.commit(send("t1", "slow", sender="alice", cmid="late"))
                )
                await _logged(process, STARTED)  # the commit is inside the slow record write
                process.process.terminate()
                status = (await asyncio.wait_for(anext(stream), 5)).status
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
                ack = await asyncio.wait_for(in_flight, 10)
                assert (ack.conversation, ack.cmid, ack.seq) == ("slow", "late", 1)
        code = await asyncio.to_thread(process.process.wait, 20)
        assert code == 0
        assert "shutdown requested" in process.log()
    finally:
        process.close()


async def test_the_subprocess_serves_metrics_and_probes(serve: ServeProcess) -> None:
    status, body = await http_get(serve.http + "/readyz")
    assert status == 200
    assert body == (
        "ready: memory backend answers; "
        "memory backend: not durable, data is lost when the process stops\n"
    )
    status, metrics = await http_get(serve.http + "/metrics")
    assert (
        status == 200
        and 'message_committer_backend_info{backend="memory",durable="false"}' in metrics
    )
    assert (await http_get(serve.http + "/healthz")) == (200, "ok\n")
    async with CommitClient.connect(serve.target) as client:
        assert await client.health("message_committer.v1.MessageCommitterService") == "SERVING"


async def _logged(process: ServeProcess, line: str, timeout_s: float = 20.0) -> None:
    """Wait until the process's log holds ``line`` (polled; bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while line not in process.log():
        assert loop.time() < deadline, f"{line!r} not logged within {timeout_s}s"
        await asyncio.sleep(0.02)


def _closed_port() -> int:
    return free_port()  # reserved: nothing of ours will listen there


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        ([], {}, 2, "no backend chosen: pass --backend or set MC_BACKEND"),
        (["--backend", "sqlite"], {}, 2, "unknown backend"),
        (["--backend", "redis"], {"MC_REDIS_URL": ""}, 2, "the redis backend needs MC_REDIS_URL"),
        (["--backend", "scylla"], {}, 2, "the scylla backend needs MC_SCYLLA_CONTACT_POINTS"),
        (["--backend", "memory", "--grpc-address", "nowhere"], {}, 2, "MC_GRPC_ADDRESS"),
        (["--backend", "memory", "--tls-cert", "/nonexistent.pem"], {}, 2, "TLS needs both"),
        (["--backend", "memory", "--recovery-interval", "soon"], {}, 2, "--recovery-interval"),
        (
            ["--backend", "redis"],
            {"MC_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:{_closed_port()}/0"},
            3,
            "cannot open the redis backend (1 host): StoreUnavailable",
        ),
    ],
)
def test_start_up_fails_closed_with_one_line(
    args: list[str], env: dict[str, str], code: int, message: str
) -> None:
    env = {"MC_BACKEND": "", **env}
    result = run_cli(["serve", "--http-address", "127.0.0.1:0", *args], env=env)
    assert result.returncode == code, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("message-committer: ") and message in last
    assert "Traceback" not in result.stderr and SECRET not in result.stderr + result.stdout


def test_a_port_in_use_fails_start_up(serve: ServeProcess) -> None:
    result = run_cli(
        ["serve", "--backend", "memory", "--grpc-address", serve.target],
        env={"MC_HTTP_ADDRESS": "127.0.0.1:0"},
    )
    assert result.returncode == 2
    assert "cannot listen on MC_GRPC_ADDRESS" in result.stderr.strip().splitlines()[-1]


async def test_the_client_gives_up_on_a_server_that_is_not_there() -> None:
    from service.client import RetryPolicy

    retry = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, deadline_s=3.0)
    async with CommitClient.connect(f"127.0.0.1:{_closed_port()}", retry=retry) as client:
        with pytest.raises(Unavailable):
            await client.commit(send("t1", cmid="x"))
        assert client.retries == 2
