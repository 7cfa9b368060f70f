"""gRPC from outside: unary calls through grpcurl (server reflection, no stubs of
either tree, no retries) and health through grpc-health-probe, so a call means
the same against both trees."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.ab.parts import ProbeError, run, tool

CALL_TIMEOUT_S = 30.0
COMMITTER = "message_committer.v1.MessageCommitterService"
MEMBERSHIP = "message_committer.v1.ConversationMembershipService"


@dataclass(frozen=True, slots=True)
class Reply:
    """One unary call's outcome: the response JSON, or the status."""

    ok: bool
    data: dict[str, Any]
    code: str = "OK"
    message: str = ""

    def __str__(self) -> str:
        return "OK" if self.ok else f"{self.code} ({self.message[:80]})"


_CODES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    16: "UNAUTHENTICATED",
}  # fmt: skip


def call(target: str, method: str, body: Mapping[str, Any], timeout: float = 20.0) -> Reply:
    """One unary RPC through grpcurl (server reflection); no retries."""
    done = run(
        [tool("grpcurl"), "-plaintext", "-format-error", "-emit-defaults",
         "-max-time", str(timeout), "-d", "@", target, method],
        stdin=json.dumps(body), timeout=timeout + CALL_TIMEOUT_S,
    )  # fmt: skip
    text = done.stdout if done.stdout.strip() else done.stderr
    try:
        data = json.loads(text) if text.strip().startswith("{") else {}
    except ValueError:
        data = {}
    if done.returncode == 0:
        return Reply(True, data)
    if "code" in data:
        return Reply(False, data, _CODES.get(int(data["code"]), str(data["code"])),
                     str(data.get("message", "")))  # fmt: skip
    raise ProbeError(f"grpcurl failed: {(done.stderr or done.stdout).strip()[:200]}")


def health(target: str) -> str:
    """SERVING, NOT_SERVING or UNREACHABLE, as grpc-health-probe sees the server."""
    done = run([tool("grpc-health-probe"), "-addr", target, "-connect-timeout", "3s",
                "-rpc-timeout", "3s"], timeout=20)  # fmt: skip
    if done.returncode == 0:
        return "SERVING"
    if "NOT_SERVING" in done.stdout + done.stderr:
        return "NOT_SERVING"
    return "UNREACHABLE"


def wait_health(target: str, want: str, within_s: float) -> tuple[str, float]:
    """Probe until ``want`` is seen or ``within_s`` passed: (last status, seconds)."""
    started = time.monotonic()
    status = health(target)
    while status != want and time.monotonic() - started < within_s:
        time.sleep(0.1)
        status = health(target)
    return status, time.monotonic() - started


def create_conversation(target: str, tenant: str, conversation: str, *members: str) -> Reply:
    body = {"tenant": tenant, "conversation": conversation, "members": list(members)}
    return call(target, f"{MEMBERSHIP}/CreateConversation", body)


def send(
    tenant: str, conversation: str, cmid: str, text: str, sender: str = "alice"
) -> dict[str, Any]:
    """The JSON of one AuthenticatedSend with an inline text body."""
    body = base64.b64encode(text.encode()).decode("ascii")
    return {
        "tenant": tenant, "sender": sender, "device": "phone", "conversation": conversation,
        "client_message_id": cmid,
        "content": {"message_type": "MESSAGE_TYPE_TEXT", "inline_body": body},
    }  # fmt: skip


def commit(target: str, request: Mapping[str, Any], timeout: float = 20.0) -> Reply:
    return call(target, f"{COMMITTER}/Commit", {"send": dict(request)}, timeout)


def ack(reply: Reply) -> tuple[int, str]:
    """(seq, message id) of a Commit or Resume reply."""
    message = reply.data.get("message", {})
    return int(message.get("seq", 0)), str(message.get("message_id", ""))


def resume(target: str, tenant: str, conversation: str, cmid: str, sender: str = "alice") -> Reply:
    body = {"tenant": tenant, "sender": sender, "client_message_id": cmid,
            "conversation": conversation}  # fmt: skip
    return call(target, f"{COMMITTER}/Resume", body)


def recover_due(target: str, max_items: int = 100) -> Reply:
    return call(target, f"{COMMITTER}/RecoverDue", {"older_than_ms": 0, "max_items": max_items})


def history_seqs(target: str, tenant: str, conversation: str, actor: str = "bob") -> list[int]:
    body = {"tenant": tenant, "conversation": conversation, "actor": actor,
            "direction": "DIRECTION_FORWARD", "limit": 100, "max_bytes": 1 << 20}  # fmt: skip
    reply = call(target, f"{COMMITTER}/History", body)
    if not reply.ok:
        raise ProbeError(f"history failed: {reply}")
    page = reply.data.get("page", reply.data)
    return [int(r["seq"]) for r in page.get("records", [])]
