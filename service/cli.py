"""``message-committer``: serve the service, or talk to a running one.

::

    message-committer serve --backend memory
    message-committer conversation create --tenant t1 --conversation c1 --member alice --member bob
    message-committer send --tenant t1 --sender alice --device phone --conversation c1 \\
        --cmid m-1 --text "hi"
    message-committer history --tenant t1 --conversation c1 --actor bob

Commands that other parts of the project own (``migrate``, ``bench``, ...)
are listed in ``DELEGATED`` and imported only when run; each is a module
with ``main(argv) -> int``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service import config as service_config
from service import eventloop, logformat
from service.api.errors import RemoteError, rule_for
from service.client import ClientTls, CommitClient, MembershipChange, QueuedIntent, RetryPolicy
from service.config import StartupError, parse_duration
from service.domain.errors import CommitError
from service.domain.ids import CommitKey
from service.domain.model import (
    AbandonOutcome,
    AuthenticatedSend,
    BodyReference,
    CommittedMessage,
    Direction,
    HistoryPage,
    HistoryQuery,
    MessageContent,
    MessageType,
)
from service.tracing import from_environment

PROG = "message-committer"

DELEGATED: dict[str, tuple[str, str]] = {
    "relay": ("service.relay_main", "deliver the outbox into mailboxes (Redis, Scylla)"),
    "relay-dead-letters": ("service.dead_letters", "list or requeue the relay's dead letters"),
    "mailbox-new-epoch": ("service.new_epoch", "start a user's inbox or a lane's next epoch"),
    "migrate": ("backends.migrate", "initialise or upgrade the Redis or Scylla storage"),
    "redis-record-size": ("backends.redis.sizing", "measure Redis memory per committed message"),
    "bench": ("toolkit.bench.cli", "run the commit benchmark against a backend"),
    "bench-delivery": (
        "toolkit.bench.delivery",
        "measure commit-to-mailbox latency and fan-out throughput",
    ),
    "fault-campaign": (
        "toolkit.campaign.cli",
        "run seeded fault-injection scenarios and check the invariants",
    ),
    "nemesis": (
        "toolkit.nemesis.cli",
        "faults on replicas and a clustered backend, checked by two history checkers",
    ),
    "delivery-soak": (
        "toolkit.soak.cli",
        "deliver under failovers, kills and skewed clocks, then check every mailbox",
    ),
    "chat": ("client.chat", "a terminal chat on the client runtime (seed 001)"),
    "client-campaign": (
        "toolkit.client_campaign.cli",
        "crash client runtimes at every fault point, with server kills; count lost and duplicated",
    ),
}


CAMPAIGNS = frozenset(
    {"bench", "bench-delivery", "fault-campaign", "nemesis", "delivery-soak", "client-campaign"}
)
"""Delegated commands that start processes of their own (``relay`` and the operator
commands handle SIGTERM themselves)."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in DELEGATED:
        return _delegate(args_list[0], args_list[1:])
    args = build_parser().parse_args(args_list)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


def _delegate(name: str, argv: list[str]) -> int:
    module_name = DELEGATED[name][0]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        print(f"{PROG}: the {name} command is not available in this build", file=sys.stderr)
        return 2
    if name in CAMPAIGNS:
        # SIGTERM (timeout, kill, a CI runner) stops a campaign as Ctrl-C does, so its
        # finally blocks stop the servers, relays and devices it started; they run in
        # sessions of their own and would outlive it.
        signal.signal(signal.SIGTERM, _interrupt)
    result: int = module.main(argv)
    return result


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --- the parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Serve the message commit service, or talk to a running one."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the gRPC service",
        description="Run the service. Every flag can also be set as MC_<FLAG> in the "
        "environment; secrets (MC_REDIS_URL, MC_SCYLLA_PASSWORD) only there.",
    )
    service_config.add_arguments(serve)
    serve.set_defaults(run=_serve)

    conversation = commands.add_parser("conversation", help="manage conversation membership")
    actions = conversation.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, helptext, method in (
        ("create", "create a conversation with its first members", "create_conversation"),
        ("add-members", "add members to a conversation", "add_members"),
        ("remove-members", "remove members from a conversation", "remove_members"),
    ):
        p = _client_parser(actions, action, helptext)
        p.add_argument("--member", action="append", required=True, help="a user id (repeat)")
        p.set_defaults(call=_membership_call(method))
    members = _client_parser(actions, "members", "list the members of a conversation")
    members.add_argument("--page-size", type=int, default=0, help="members per page (0: 100)")
    members.set_defaults(call=_list_members)

    send = _client_parser(commands, "send", "commit one message (retried with the same key)")
    _send_arguments(send)
    send.set_defaults(call=_send)

    history = _client_parser(commands, "history", "read one page of history")
    history.add_argument("--actor", required=True, help="the member reading")
    history.add_argument("--direction", choices=[d.value for d in Direction], default="backward")
    history.add_argument("--anchor", type=int, default=0, help="exclusive anchor seq (0: edge)")
    history.add_argument("--limit", type=int, default=50)
    history.add_argument("--max-bytes", type=int, default=1 << 20)
    history.set_defaults(call=_history)

    resume = _client_parser(commands, "resume", "finish or replay the commit of one key")
    resume.add_argument("--sender", required=True)
    resume.add_argument("--cmid", required=True, help="the client_message_id of the key")
    resume.set_defaults(call=_resume)

    recover = _client_parser(
        commands, "recover", "finish unfinished commits older than a grace", tenant=False
    )
    recover.add_argument("--grace", type=parse_duration, default=0.0, help="e.g. 30s (0: all)")
    recover.add_argument("--max-items", type=int, default=0, help="at most (0: 100)")
    recover.set_defaults(call=_recover)

    quarantine = commands.add_parser(
        "quarantine",
        help="list, inspect, retry and abandon quarantined intents (the recovery queue)",
    )
    q_actions = quarantine.add_subparsers(dest="action", required=True, metavar="ACTION")
    q_list = _client_parser(q_actions, "list", "list every quarantined intent", tenant=False)
    q_list.add_argument("--page-size", type=int, default=0, help="items per page (0: 100)")
    q_list.set_defaults(call=_quarantine_list)
    for action, helptext, call in (
        ("show", "show the recovery-queue entry of one key", _quarantine_show),
        ("retry", "take one key out of quarantine and finish it now", _quarantine_retry),
    ):
        q = _client_parser(q_actions, action, helptext, tenant=False)
        q.add_argument("--tenant", required=True)
        q.add_argument("--sender", required=True)
        q.add_argument("--cmid", required=True, help="the client_message_id of the key")
        q.set_defaults(call=call)
    q_abandon = _client_parser(
        q_actions, "abandon",
        "give up on one quarantined intent for good (audited): its key then answers"
        " COMMIT_ABANDONED, its seq is a permanent history gap, retention is released",
        tenant=False,
    )  # fmt: skip
    q_abandon.add_argument("--tenant", required=True)
    q_abandon.add_argument("--sender", required=True)
    q_abandon.add_argument("--cmid", required=True, help="the client_message_id of the key")
    q_abandon.add_argument("--reason", required=True, help="why, for the audit record (no content)")
    q_abandon.add_argument(
        "--operator", default=_login(), help="who, for the audit record (default: your login)"
    )
    q_abandon.set_defaults(call=_quarantine_abandon)

    health = _client_parser(commands, "health", "ask the server's health service", tenant=False)
    health.add_argument("--service", default="", help="a service name ('' = the server)")
    health.set_defaults(call=_health)

    for name, (_, helptext) in DELEGATED.items():
        commands.add_parser(name, help=helptext, add_help=False)
    return parser


def _client_parser(
    commands: Any, name: str, helptext: str, *, tenant: bool = True
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(name, help=helptext, description=helptext)
    env = os.environ
    p.add_argument(
        "--target",
        default=env.get("MC_TARGET", "127.0.0.1:50051"),
        help="HOST:PORT of the server [env MC_TARGET; default 127.0.0.1:50051]",
    )
    p.add_argument("--tls-ca", default=env.get("MC_TLS_CA", ""), help="PEM CA to verify the server")
    p.add_argument("--tls-cert", default="", help="PEM client certificate (mutual TLS)")
    p.add_argument("--tls-key", default="", help="PEM client key (mutual TLS)")
    p.add_argument("--timeout", type=parse_duration, default=15.0, help="deadline incl. retries")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    if tenant:
        p.add_argument("--tenant", required=True)
        p.add_argument("--conversation", required=True)
    p.set_defaults(run=_run_client)
    return p


def _send_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sender", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--cmid", default="", help="client_message_id (default: a new UUID)")
    p.add_argument("--type", choices=[t.value for t in MessageType], default="text")
    p.add_argument("--custom-type", default="", help="name of a custom message type")
    p.add_argument("--text", default=None, help="inline body (UTF-8)")
    p.add_argument("--body-ref-uri", default="", help="body stored elsewhere: its URI")
    p.add_argument("--body-ref-size", type=int, default=0, help="its size in bytes")
    p.add_argument("--body-ref-sha256", default="", help="its SHA-256 (hex)")
    p.add_argument("--mention", action="append", default=[], help="a mentioned user (repeat)")
    p.add_argument("--reply-to", default="", help="the message id replied to")


# --- serve ---------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    json_errors = (args.log_format or os.environ.get("MC_LOG_FORMAT", "")).strip() == "json"
    try:
        config = service_config.load(vars(args), os.environ)
        tracing = from_environment(os.environ)  # before the backend opens: it patches redis-py
    except StartupError as exc:
        return _startup_failed(exc, json_errors)
    logformat.configure(
        config.log_level, config.log_format, tracing.trace_ids if tracing.enabled else None
    )
    if config.log_level.upper() != "DEBUG":
        # The CQL driver logs node addresses (reconnects, refused connections);
        # the backend already reports every failure by error type alone.
        logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    from service.bootstrap import serve  # the composition root, only for serve

    try:
        return eventloop.run(serve(config, tracing), config.event_loop)
    except StartupError as exc:
        return _startup_failed(exc, config.log_format == "json")
    finally:
        tracing.shutdown()


def _startup_failed(exc: StartupError, as_json: bool) -> int:
    """One line on stderr naming the rule broken (JSON when the log is JSON)."""
    text = f"{PROG}: {exc}"
    line = logformat.json_line(logging.ERROR, "service.cli", text) if as_json else text
    print(line, file=sys.stderr)
    return exc.exit_code


# --- client commands ----------------------------------------------------------------

Call = Callable[[CommitClient, argparse.Namespace], Awaitable[object]]


def _run_client(args: argparse.Namespace) -> int:
    call: Call = args.call
    try:
        tls = _tls(args)
    except OSError:
        print(f"{PROG}: a TLS file could not be read", file=sys.stderr)
        return 2
    retry = RetryPolicy(deadline_s=args.timeout, attempt_timeout_s=min(5.0, args.timeout))

    async def run() -> object:
        async with CommitClient.connect(args.target, tls=tls, retry=retry) as client:
            return await call(client, args)

    try:
        result = asyncio.run(run())
    except CommitError as exc:
        print(f"error: {_code_name(exc)} {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(_render(result, as_json=args.json))
    return 0


def _code_name(exc: CommitError) -> str:
    if isinstance(exc, RemoteError):
        return exc.code.name
    rule = rule_for(exc)
    return rule.code.name if rule else "UNKNOWN"


def _tls(args: argparse.Namespace) -> ClientTls | None:
    if not (args.tls_ca or args.tls_cert):
        return None

    def read(path: str) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return ClientTls(read(args.tls_ca), read(args.tls_cert), read(args.tls_key))


def _membership_call(method: str) -> Call:
    async def call(client: CommitClient, args: argparse.Namespace) -> MembershipChange:
        change: MembershipChange = await getattr(client, method)(
            args.tenant, args.conversation, args.member
        )
        return change

    return call


async def _list_members(client: CommitClient, args: argparse.Namespace) -> dict[str, object]:
    members: list[str] = []
    token, version = "", 0
    for _ in range(10_000):  # bounded: 10,000 pages
        page = await client.list_members(
            args.tenant, args.conversation, page_size=args.page_size, page_token=token
        )
        members.extend(page.members)
        token, version = page.next_page_token, page.version
        if not token:
            break
    return {"conversation": args.conversation, "version": version, "members": members}


async def _send(client: CommitClient, args: argparse.Namespace) -> CommittedMessage:
    ref = None
    if args.body_ref_uri:
        ref = BodyReference(args.body_ref_uri, args.body_ref_size, args.body_ref_sha256)
    content = MessageContent(
        message_type=MessageType(args.type),
        body=args.text.encode() if args.text is not None else b"",
        body_ref=ref,
        custom_type=args.custom_type,
    )
    send = AuthenticatedSend(
        tenant=args.tenant,
        sender=args.sender,
        device=args.device,
        conversation=args.conversation,
        cmid=args.cmid or str(uuid.uuid4()),
        content=content,
        mentions=tuple(args.mention),
        reply_to=args.reply_to,
    )
    return await client.commit(send)


async def _history(client: CommitClient, args: argparse.Namespace) -> HistoryPage:
    query = HistoryQuery(
        tenant=args.tenant,
        conversation=args.conversation,
        actor=args.actor,
        direction=Direction(args.direction),
        anchor_seq=args.anchor,
        limit=args.limit,
        max_bytes=args.max_bytes,
    )
    return await client.history(query)


async def _resume(client: CommitClient, args: argparse.Namespace) -> CommittedMessage:
    key = CommitKey(args.tenant, args.sender, args.cmid)
    return await client.resume(key, args.conversation)


async def _recover(client: CommitClient, args: argparse.Namespace) -> dict[str, int]:
    older_than = 0
    if args.grace:
        older_than = int(datetime.now(UTC).timestamp() * 1000 - args.grace * 1000)
    report = await client.recover_due(older_than, args.max_items)
    return {
        "scanned": report.scanned,
        "recovered": report.committed,
        "failed": report.failed,
        "quarantined": report.quarantined,
    }


async def _quarantine_list(client: CommitClient, args: argparse.Namespace) -> list[QueuedIntent]:
    items: list[QueuedIntent] = []
    token = ""
    for _ in range(10_000):  # bounded: 10,000 pages
        page, token = await client.list_quarantined(page_size=args.page_size, page_token=token)
        items += page
        if not token:
            break
    return items


async def _quarantine_show(client: CommitClient, args: argparse.Namespace) -> QueuedIntent:
    return await client.recovery_item(CommitKey(args.tenant, args.sender, args.cmid))


async def _quarantine_retry(client: CommitClient, args: argparse.Namespace) -> CommittedMessage:
    return await client.retry_quarantined(CommitKey(args.tenant, args.sender, args.cmid))


async def _quarantine_abandon(client: CommitClient, args: argparse.Namespace) -> dict[str, object]:
    key = CommitKey(args.tenant, args.sender, args.cmid)
    done = await client.abandon_quarantined(key, operator=args.operator, reason=args.reason)
    return {
        "abandoned": "now" if done.outcome is AbandonOutcome.ABANDONED else "before",
        "key": str(key),
        "conversation": done.conversation,
        "seq": done.seq or "-",
        "at": _time(done.at_ms),
        "operator": done.operator,
        "reason": done.reason,
    }


def _login() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in a bare container
        return "unknown"


async def _health(client: CommitClient, args: argparse.Namespace) -> dict[str, str]:
    return {"service": args.service or "(server)", "status": await client.health(args.service)}


# --- output ---------------------------------------------------------------------------


def _render(result: object, *, as_json: bool) -> str:
    if as_json:
        data = _plain(result)
        return json.dumps(data, default=_json_default, sort_keys=True)
    if isinstance(result, CommittedMessage):
        return (
            f"committed  conversation={result.conversation} seq={result.seq} "
            f"message_id={result.message_id} cmid={result.cmid} "
            f"server_time={_time(result.server_ts_ms)}"
        )
    if isinstance(result, HistoryPage):
        return _render_page(result)
    if isinstance(result, MembershipChange):
        return (
            f"conversation={result.conversation} version={result.version} "
            f"members={result.member_count}"
        )
    if isinstance(result, dict):
        return "  ".join(f"{k}={_flat(v)}" for k, v in result.items())
    if isinstance(result, QueuedIntent):
        return _render_queued(result)
    if isinstance(result, list):
        if not result:
            return "no quarantined intents"
        return "\n".join(
            _render_queued(i) if isinstance(i, QueuedIntent) else str(i) for i in result
        )
    return str(result)


def _render_queued(item: QueuedIntent) -> str:
    where = "quarantined" if item.quarantined else "queued"
    return (
        f"{where:<11} {item.key} conversation={item.conversation} state={item.state}"
        f" seq={item.seq or '-'} attempts={item.attempts} since={_time(item.created_at_ms)}"
        f" problem={item.problem or '-'}"
    )


def _render_page(page: HistoryPage) -> str:
    lines = [
        f"conversation={page.conversation} direction={page.direction.value} "
        f"last_seq={page.last_seq} available_from_seq={page.available_from_seq} "
        f"next_anchor={page.next_anchor or '-'}"
        + (
            f" abandoned_seqs={','.join(map(str, page.abandoned_seqs))}"
            if page.abandoned_seqs
            else ""
        )
    ]
    for r in page.records:
        c = r.content
        if c.body_ref is not None:
            body = f"<ref {c.body_ref.uri} {c.body_ref.size_bytes} B>"
        elif c.message_type is MessageType.TEXT:
            body = repr(c.body.decode("utf-8", "replace"))
        else:
            body = f"<{len(c.body)} B>"
        kind = c.custom_type or c.message_type.value
        lines.append(f"  #{r.seq:<6} {_time(r.server_ts_ms)} {r.sender:<12} {kind:<8} {body}")
    return "\n".join(lines)


def _plain(value: object) -> object:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return value


def _flat(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, tuple | frozenset):
        return list(value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
