"""The real gRPC tools against the real ``serve`` process: grpcurl and grpc-health-probe.

Both find everything through server reflection and the standard health
service. A test skips only when its binary is absent; scripts/install-tools.sh
installs both into .tools/bin (CI always runs it).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import tool
from tests.e2e.process import ServeProcess

pytestmark = pytest.mark.e2e

COMMITTER = "message_committer.v1.MessageCommitterService"
MEMBERSHIP = "message_committer.v1.ConversationMembershipService"
RECOVERY = "message_committer.v1.RecoveryAdminService"
MAILBOX = "message_committer.v1.MailboxService"


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    process = ServeProcess()
    try:
        yield process
    finally:
        process.close()


def _binary(name: str) -> str:
    found = tool(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/install-tools.sh (make test does)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL
    )


def test_grpcurl_lists_describes_and_calls_through_reflection(serve: ServeProcess) -> None:
    grpcurl = _binary("grpcurl")
    listed = _run(grpcurl, "-plaintext", serve.target, "list")
    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) == {
        COMMITTER,
        MEMBERSHIP,
        RECOVERY,
        MAILBOX,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    described = _run(grpcurl, "-plaintext", serve.target, "describe", COMMITTER)
    for rpc in ("Commit", "Resume", "ResumeExisting", "RecoverDue", "History"):
        assert f"rpc {rpc} (" in described.stdout

    def call(method: str, body: dict[str, object]) -> subprocess.CompletedProcess[str]:
        return _run(grpcurl, "-plaintext", "-d", json.dumps(body), serve.target, method)

    created = call(
        f"{MEMBERSHIP}/CreateConversation",
        {"tenant": "t1", "conversation": "g1", "members": ["alice", "bob"]},
    )
    assert json.loads(created.stdout)["membership"]["version"] == "1"
    send = {
        "tenant": "t1",
        "sender": "alice",
        "device": "phone",
        "conversation": "g1",
        "client_message_id": "g-1",
        "content": {"message_type": "MESSAGE_TYPE_TEXT", "inline_body": "aGk="},
    }
    first = call(f"{COMMITTER}/Commit", {"send": send})
    assert first.returncode == 0, first.stderr
    ack = json.loads(first.stdout)["message"]
    assert (ack["conversation"], ack["seq"]) == ("g1", "1")
    assert call(f"{COMMITTER}/Commit", {"send": send}).stdout == first.stdout

    send["content"] = {"message_type": "MESSAGE_TYPE_TEXT", "inline_body": "aGkh"}
    conflict = call(f"{COMMITTER}/Commit", {"send": send})
    assert conflict.returncode != 0
    assert "Code: AlreadyExists" in conflict.stderr
    assert '"reason": "IDEMPOTENCY_CONFLICT"' in conflict.stderr

    trailers = _run(
        grpcurl, "-plaintext", "-v", "-d", "{}", serve.target, "grpc.health.v1.Health/Check"
    )
    assert '"status": "SERVING"' in trailers.stdout
    assert "mc-readiness: ready: memory backend answers" in trailers.stdout


def test_grpcurl_syncs_a_mailbox_page_through_reflection_alone(serve: ServeProcess) -> None:
    """No .proto file and no stub: reflection is enough to Sync, and CURSOR_EXPIRED
    shows as FAILED_PRECONDITION with its ErrorInfo."""
    grpcurl = _binary("grpcurl")

    def call(method: str, body: dict[str, object]) -> subprocess.CompletedProcess[str]:
        return _run(grpcurl, "-plaintext", "-d", json.dumps(body), serve.target, method)

    described = _run(grpcurl, "-plaintext", serve.target, "describe", MAILBOX)
    assert "rpc Sync (" in described.stdout and "rpc Subscribe (" in described.stdout
    created = call(
        f"{MEMBERSHIP}/CreateConversation",
        {"tenant": "t2", "conversation": "g2", "members": ["alice", "bob"]},
    )
    assert created.returncode == 0, created.stderr
    for n in range(3):
        send = {
            "tenant": "t2",
            "sender": "alice",
            "device": "phone",
            "conversation": "g2",
            "client_message_id": f"s-{n}",
            "content": {"message_type": "MESSAGE_TYPE_TEXT", "inline_body": "aGk="},
        }
        assert call(f"{COMMITTER}/Commit", {"send": send}).returncode == 0
    everything: list[dict[str, object]] = []
    for _ in range(100):  # the relay inside serve delivers within moments
        synced = call(f"{MAILBOX}/Sync", {"tenant": "t2", "user": "bob"})
        assert synced.returncode == 0, synced.stderr
        everything = json.loads(synced.stdout).get("events") or []
        if len(everything) == 3:
            break
        time.sleep(0.05)
    assert [e["seq"] for e in everything] == ["1", "2", "3"]
    # A page of limit 1 holds the first whole group (one relay append: one to three
    # entries, as the relay happened to batch them); its cursor leads to the rest.
    page = json.loads(call(f"{MAILBOX}/Sync", {"tenant": "t2", "user": "bob", "limit": 1}).stdout)
    events = page["events"]
    first = events[0]["message_added"]["message"]
    assert (first["conversation"], first["seq"], first["content"]["inline_body"]) == (
        "g2",
        "1",
        "aGk=",
    )
    last = events[-1]["seq"]
    assert page["next_cursor"] == {"lane": "inbox", "epoch": "1", "seq": last}
    assert page.get("more", False) is (last != "3")
    rest = call(
        f"{MAILBOX}/Sync",
        {"tenant": "t2", "user": "bob", "cursor": page["next_cursor"]},
    )
    seqs = [e["seq"] for e in events] + [
        e["seq"] for e in json.loads(rest.stdout).get("events", [])
    ]
    assert seqs == ["1", "2", "3"]
    expired = call(
        f"{MAILBOX}/Sync",
        {"tenant": "t2", "user": "bob", "cursor": {"lane": "inbox", "epoch": "9", "seq": "1"}},
    )
    assert expired.returncode != 0
    assert "Code: FailedPrecondition" in expired.stderr
    assert '"reason": "CURSOR_EXPIRED"' in expired.stderr
    listed = call(f"{MEMBERSHIP}/ListConversations", {"tenant": "t2", "user": "bob"})
    assert json.loads(listed.stdout)["conversations"][0]["lane"] == "inbox"


@pytest.mark.parametrize("service", ["", COMMITTER, MEMBERSHIP, MAILBOX])
def test_grpc_health_probe_reports_serving(serve: ServeProcess, service: str) -> None:
    probe = _binary("grpc-health-probe")
    args = [probe, "-addr", serve.target] + (["-service", service] if service else [])
    result = _run(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout + result.stderr).strip() == "status: SERVING"


def test_grpc_health_probe_fails_for_an_unknown_service(serve: ServeProcess) -> None:
    probe = _binary("grpc-health-probe")
    result = _run(probe, "-addr", serve.target, "-service", "no.such.Service")
    assert result.returncode != 0
