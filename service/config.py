"""Service configuration: one frozen dataclass, read once at start-up.

Every field can be set by an environment variable ``MC_<FIELD>`` (upper
case) and, except secrets, by a flag ``--<field>`` (dashes); a flag wins over
the environment, the environment over the default. Durations accept
``250ms``, ``30s``, ``15m``, ``24h``, ``7d`` or plain seconds. Secrets
(``MC_REDIS_URL``, ``MC_SCYLLA_PASSWORD``) are environment-only, so they never
show in a process list, and are left out of ``repr``.

Bad values raise ConfigError (exit code 2) with a one-line message that
names the variable and the rule, never the value.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.domain.delivery import DeliverySettings, MailboxSettings
from service.domain.limits import CommitLimits
from service.domain.ports import StoreSettings
from service.domain.recovery import RecoveryPolicy
from service.domain.relay import RelayPolicy

BACKENDS = ("memory", "redis", "scylla")
LOG_FORMATS = ("text", "json")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")
SCYLLA_SEND_PATHS = ("auto", "driver", "direct")  # backends.scylla.send_path.SEND_PATHS
_LIMITS = CommitLimits()
_DURATION = {"kind": "duration"}
_SIGNED_DURATION = {"kind": "signed_duration"}
_BOOL = {"kind": "bool"}
_SECRET = {"secret": True}
_LIST = {"kind": "list"}


class StartupError(Exception):
    """The service cannot start; ``exit_code`` says why."""

    exit_code = 1


class ConfigError(StartupError):
    """A configuration value is missing or invalid."""

    exit_code = 2


DEFAULT_MAX_STREAMS = 20_000
"""``MC_MAX_STREAMS``'s default (the benchmark opens at most this many idle streams)."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything the ``serve`` command can be told."""

    backend: str = ""
    """Where messages are stored: memory, redis or scylla. No default: it must
    be chosen explicitly, and nothing ever falls back to memory."""

    grpc_address: str = "127.0.0.1:50051"
    """HOST:PORT the gRPC server listens on (port 0 picks a free port)."""

    http_address: str = "127.0.0.1:9464"
    """HOST:PORT of the HTTP side port serving /metrics, /healthz, /readyz."""

    redis_url: str = field(default="", repr=False, metadata=_SECRET)
    """Redis URL (redis:// or rediss://), required for the redis backend.
    Environment only: it may hold a password. Never logged."""

    redis_prefix: str = "mc"
    """Prefix of every Redis key this service writes."""

    redis_deployment: str = ""
    """The Redis deployment identity this service serves: printed by ``migrate
    --backend redis``, kept in the service's configuration or secret. When set (or
    MC_REDIS_DEPLOYMENT_FILE), a Redis holding any other identity is refused, so a
    wiped Redis that was migrated again is never served as this deployment."""

    redis_deployment_file: str = ""
    """A file holding that identity, kept outside Redis (compose: its own volume);
    ``migrate`` writes it when it initialises a deployment and checks it otherwise."""

    redis_max_connections: int = 128
    """Redis connections this replica may open (at least 2: the scripts share one);
    callers beyond it wait for a free one."""

    redis_wait_replicas: int | None = field(default=None, metadata={"kind": "replicas"})
    """Replicas that must hold a commit before it is acknowledged (Redis WAIT). auto:
    1 for a redis+sentinel:// or redis+cluster:// URL (a failover then keeps every
    ACK), 0 for one server. 0 acks what the primary holds, which a failover can lose."""

    redis_wait_timeout: float = field(default=1.0, metadata=_DURATION)
    """How long a commit waits for those replicas before it answers UNAVAILABLE
    (recoverable: a retry of the same key waits again)."""

    redis_allow_eviction: bool = field(default=False, metadata=_BOOL)
    """Serve even when Redis's maxmemory-policy is not noeviction. Evicting Redis
    loses committed records and counters (a retried send then becomes a second
    message); only for throwaway data. Logged loudly at start-up."""

    scylla_contact_points: tuple[str, ...] = field(default=(), metadata=_LIST)
    """Comma-separated CQL contact points (host names or IPs), required for scylla."""

    scylla_port: int = 9042
    """CQL native port of the contact points."""

    scylla_keyspace: str = "message_committer"
    """Keyspace holding the tables (created by the migrate command)."""

    scylla_username: str = ""
    """CQL user name; empty for no authentication."""

    scylla_password: str = field(default="", repr=False, metadata=_SECRET)
    """CQL password. Environment only; never logged."""

    scylla_local_dc: str = ""
    """The data centre this replica prefers (DC-aware load balancing)."""

    scylla_consistency: str = "LOCAL_QUORUM"
    """Consistency level of regular reads and writes."""

    scylla_single_dc_conversations: bool = field(default=False, metadata=_BOOL)
    """Conditional writes use SERIAL (the default). True switches them to LOCAL_SERIAL,
    which is only safe when every write of a conversation (every send and every retry,
    also after a failover) comes from one data centre: a send retried in another DC
    could get a second seq and a second ACK. Saves the cross-DC round trips of each
    Paxos phase."""

    scylla_max_clock_skew: float = field(default=3.0, metadata=_DURATION)
    """Largest difference between this replica's clock and the cluster's that it
    serves with; checked at start-up and by every readiness probe."""

    scylla_send_path: str = "auto"
    """How prepared statements reach the cluster: auto (the direct path, when the
    installed scylla-driver is the release it was built for and its frames are the
    driver's own; else the driver's, with a warning and the
    direct_path_refused event), direct (refuse to start otherwise) or driver."""

    scylla_tls_ca: str = ""
    """PEM file of the CA that signed the cluster's node certificates: TLS to the
    cluster, each node's certificate checked against it and against the address
    dialled. Empty: no TLS."""

    scylla_tls_cert: str = ""
    """PEM client certificate for the cluster (with MC_SCYLLA_TLS_KEY), for nodes that
    require client certificates; needs MC_SCYLLA_TLS_CA."""

    scylla_tls_key: str = ""
    """PEM private key of MC_SCYLLA_TLS_CERT."""

    scylla_node_proxies: tuple[str, ...] = field(default=(), metadata=_LIST)
    """Comma-separated NODE=HOST:PORT routes: reach the CQL node whose address is
    NODE through HOST:PORT (a proxy, e.g. for fault injection); other nodes directly."""

    idempotency_window: float = field(default=7 * 86400.0, metadata=_DURATION)
    """How long a committed key replays its ACK (default 7d)."""

    history_retention: float = field(default=30 * 86400.0, metadata=_DURATION)
    """How long a committed message stays readable in history (default 30d)."""

    tls_cert: str = ""
    """PEM certificate chain of the server; enables TLS (with tls_key)."""

    tls_key: str = ""
    """PEM private key of the server certificate."""

    tls_client_ca: str = ""
    """PEM CA bundle; when set, clients must present a certificate it signed (mTLS)."""

    max_message_bytes: int = 4 * 1024 * 1024
    """Largest gRPC message received or sent, in bytes."""

    max_concurrent_rpcs: int = 1000
    """Unary RPCs served at once; more are rejected with RESOURCE_EXHAUSTED (0 = unlimited).
    Streams (Subscribe) are counted apart (service/api/limits.py)."""

    max_streams: int = DEFAULT_MAX_STREAMS
    """Server streams (Subscribe) served at once, apart from unary RPCs; more are rejected
    with RESOURCE_EXHAUSTED. An idle stream costs about 19 KiB of server memory."""

    max_streams_per_user: int = 16
    """Server streams one (tenant, user) may hold at once on one replica."""

    recovery_interval: float = field(default=10.0, metadata=_DURATION)
    """How often this replica runs recovery (jittered by +-20%)."""

    recovery_grace: float = field(default=30.0, metadata=_DURATION)
    """Only intents older than this are recovered (younger ones are likely in flight)."""

    recovery_batch: int = 100
    """Intents per recover_due call (at most 10 calls per run)."""

    recovery_first_retry: float = field(default=10.0, metadata=_DURATION)
    """Delay before an intent whose recovery failed is tried again; doubles each time."""

    recovery_max_retry: float = field(default=3600.0, metadata=_DURATION)
    """Longest delay between two recovery attempts of one intent."""

    recovery_quarantine_after: int = 8
    """Failed recovery attempts after which an intent is quarantined (kept, never
    ACKed, listed by `message-committer quarantine list`)."""

    readiness_interval: float = field(default=5.0, metadata=_DURATION)
    """How often the backend is probed for readiness."""

    readiness_timeout: float = field(default=2.0, metadata=_DURATION)
    """How long one readiness probe may take before it counts as failed."""

    shutdown_grace: float = field(default=10.0, metadata=_DURATION)
    """How long in-flight RPCs may run after SIGTERM before they are cancelled."""

    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""

    log_format: str = "text"
    """text (one readable line per record, for a terminal) or json (one JSON object
    per line: time, level, logger, message, and trace_id/span_id inside a traced call)."""

    event_loop: str = "auto"
    """auto (uvloop when it is installed, else asyncio), asyncio or uvloop (fails to
    start when uvloop is not installed)."""

    max_inline_body_bytes: int = _LIMITS.max_inline_body_bytes
    """Largest inline message body; larger bodies go by reference."""

    max_body_ref_uri_bytes: int = _LIMITS.max_body_ref_uri_bytes
    """Longest body reference URI, in bytes."""

    max_custom_type_chars: int = _LIMITS.max_custom_type_chars
    """Longest custom message type name."""

    max_mentions: int = _LIMITS.max_mentions
    """Most users one message may mention."""

    max_history_page: int = _LIMITS.max_history_page
    """Most records one history page may ask for."""

    max_history_page_bytes: int = _LIMITS.max_history_page_bytes
    """Largest byte budget one history page may ask for."""

    sender_rate_per_s: float = _LIMITS.sender_rate_per_s
    """Sustained sends per second per sender on one replica (0 disables the quota)."""

    sender_burst: int = _LIMITS.sender_burst
    """Sends a sender may make at once before the rate applies."""

    fanout_threshold: int = 1000
    """Conversations with more members than this are not fanned out to each
    member's inbox: their messages go to one lane of their own,
    conversation:<id>, that members sync. Sticky: a conversation that had its
    own lane keeps it. Serve and relay must agree (docs/delivery.md)."""

    mailbox_retention: float = field(default=7 * 86400.0, metadata=_DURATION)
    """How long a mailbox entry stays; older groups are trimmed and a cursor
    below the trim watermark gets CURSOR_EXPIRED (the client rebuilds)."""

    mailbox_max_entries: int = 10_000
    """Most entries one mailbox lane keeps; older groups are trimmed."""

    mailbox_dedupe_window: float = field(default=86400.0, metadata=_DURATION)
    """How long a lane remembers the message ids of entries trimmed by count, so a
    reconciled or requeued message is not appended twice (at most
    MC_MAILBOX_RETENTION, at least 1h); the relay and requeue refuse messages
    older than it (dead letters). Costs about 230 bytes per remembered id on Redis."""

    subscribe_poll_interval: float = field(default=1.0, metadata=_DURATION)
    """How often the replica's one lane watcher reads the heads of every subscribed lane."""

    relay_http_address: str = "127.0.0.1:9465"
    """HOST:PORT of the relay's HTTP side port (/metrics, /healthz, /readyz)."""

    relay_lease: float = field(default=10.0, metadata=_DURATION)
    """How long a relay's lease on an outbox partition lasts unless renewed
    (every third of it); a dead relay's partitions move after this."""

    relay_batch: int = 100
    """Outbox entries a relay claims and fans out together per step (1 to 1000)."""

    relay_idle_wait: float = field(default=1.0, metadata=_DURATION)
    """Longest a relay waits for new outbox entries before looking again."""

    relay_busy_pause: float = field(default=0.01, metadata=_DURATION)
    """Memory only (the relay inside serve, on the RPCs' event loop): how long a
    partition waits after a step that delivered something before its next step
    (0: none). Fewer, fuller steps: less server CPU per commit under load, at
    most this much more delivery latency for a message committed meanwhile."""

    relay_max_attempts: int = 10
    """Failed delivery attempts after which an outbox entry is dead-lettered."""

    relay_first_retry: float = field(default=1.0, metadata=_DURATION)
    """Delay before a failed delivery is tried again; doubles each time."""

    relay_max_retry: float = field(default=60.0, metadata=_DURATION)
    """Longest delay between two delivery attempts of one outbox entry."""

    relay_settle_window: float = field(default=10.0, metadata=_DURATION)
    """Scylla only: outbox entries younger than this are delivered at once but
    acknowledged only once older, because a writer with a slower clock may
    still add an entry before them (keep it above the request timeout plus
    MC_SCYLLA_MAX_CLOCK_SKEW)."""

    relay_outbox_retention: float = field(default=86400.0, metadata=_DURATION)
    """How long delivered outbox entries are kept before the relay trims them
    (Redis streams; Scylla hour buckets once all their entries are settled:
    undelivered entries never expire)."""

    relay_dead_letter_retention: float = field(default=30 * 86400.0, metadata=_DURATION)
    """How long the relay keeps dead letters before it drops them, counted and
    logged (Redis XTRIM MINID, Scylla a counted delete plus a row TTL of this + 1d
    as a backstop, memory by age and at most 10,000 per partition)."""

    test_clock_offset: float = field(default=0.0, metadata=_SIGNED_DURATION)
    """Tests only: run this replica's clock this far off (e.g. 2d or -30s), to
    show what a skewed host does. Never set it in production."""

    def limits(self) -> CommitLimits:
        return CommitLimits(
            max_inline_body_bytes=self.max_inline_body_bytes,
            max_body_ref_uri_bytes=self.max_body_ref_uri_bytes,
            max_custom_type_chars=self.max_custom_type_chars,
            max_mentions=self.max_mentions,
            max_history_page=self.max_history_page,
            max_history_page_bytes=self.max_history_page_bytes,
            sender_rate_per_s=self.sender_rate_per_s,
            sender_burst=self.sender_burst,
        )

    def scylla_node_routes(self) -> dict[str, tuple[str, int]]:
        """``scylla_node_proxies`` as ``{node address: (host, port)}``."""
        routes = {}
        for item in self.scylla_node_proxies:
            node, sep, target = item.partition("=")
            if not sep or not node.strip():
                raise ConfigError("MC_SCYLLA_NODE_PROXIES: each item must be NODE=HOST:PORT")
            routes[node.strip()] = split_address(target.strip(), "MC_SCYLLA_NODE_PROXIES")
        return routes

    def store_settings(self) -> StoreSettings:
        return StoreSettings(
            idempotency_window_ms=int(self.idempotency_window * 1000),
            history_retention_ms=int(self.history_retention * 1000),
        )

    def relay_policy(self) -> RelayPolicy:
        return RelayPolicy(
            batch=self.relay_batch,
            lease_ms=int(self.relay_lease * 1000),
            fanout_threshold=self.fanout_threshold,
            max_attempts=self.relay_max_attempts,
            first_retry_ms=int(self.relay_first_retry * 1000),
            max_retry_ms=int(self.relay_max_retry * 1000),
        )

    def mailbox_settings(self) -> MailboxSettings:
        return MailboxSettings(
            retention_ms=int(self.mailbox_retention * 1000),
            max_entries=self.mailbox_max_entries,
            dedupe_window_ms=int(self.mailbox_dedupe_window * 1000),
        )

    def delivery_settings(self) -> DeliverySettings:
        return DeliverySettings(
            mailbox=self.mailbox_settings(),
            outbox_retention_ms=int(self.relay_outbox_retention * 1000),
            settle_window_ms=int(self.relay_settle_window * 1000),
            dead_letter_retention_ms=int(self.relay_dead_letter_retention * 1000),
        )

    def redis_deployment_identity(self) -> str:
        """MC_REDIS_DEPLOYMENT, else the content of MC_REDIS_DEPLOYMENT_FILE ("" if neither)."""
        if self.redis_deployment:
            return self.redis_deployment.strip()
        if not self.redis_deployment_file:
            return ""
        try:
            with open(self.redis_deployment_file, encoding="ascii") as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError):
            raise ConfigError("MC_REDIS_DEPLOYMENT_FILE cannot be read") from None

    def recovery_policy(self) -> RecoveryPolicy:
        return RecoveryPolicy(
            first_retry_ms=int(self.recovery_first_retry * 1000),
            max_retry_ms=int(self.recovery_max_retry * 1000),
            quarantine_after=self.recovery_quarantine_after,
        )


# --- field documentation (the attribute docstrings above) ------------------------


def _field_docs() -> dict[str, str]:
    try:
        tree = ast.parse(inspect.getsource(ServiceConfig))
    except (OSError, TypeError):  # no source (frozen app): no help text
        return {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        doc = (
            after.value.value
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            else None
        )
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(doc, str)
        ):
            docs[node.target.id] = " ".join(doc.split())
    return docs


FIELD_DOCS = _field_docs()


@dataclass(frozen=True, slots=True)
class Option:
    """How one field is set: its variable, its flag and its parser."""

    name: str
    env: str
    flag: str | None
    parse: Callable[[str], object]
    default: object
    doc: str

    @property
    def default_text(self) -> str:
        """The default as a person would write it ("7d", "none", "127.0.0.1:50051")."""
        value = self.default
        if value in ("", ()):
            return "none"
        if value is None:
            return "auto"
        if isinstance(value, tuple):
            return ",".join(value)
        if self.parse in (parse_duration, parse_signed_duration) and isinstance(value, float):
            return format_duration(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def options() -> list[Option]:
    """Every field's option, in declaration order."""
    result = []
    for f in dataclasses.fields(ServiceConfig):
        kind = f.metadata.get("kind") or str(f.type)
        result.append(
            Option(
                name=f.name,
                env=f"MC_{f.name.upper()}",
                flag=None if f.metadata.get("secret") else "--" + f.name.replace("_", "-"),
                parse=_PARSERS[kind],
                default=f.default,
                doc=FIELD_DOCS.get(f.name, ""),
            )
        )
    return result


# --- parsing ---------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")


def parse_duration(text: str) -> float:
    """Seconds in ``250ms``, ``30s``, ``15m``, ``24h``, ``7d`` or ``12.5``."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError("expected a duration such as 250ms, 30s, 15m, 24h or 7d")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_signed_duration(text: str) -> float:
    """``parse_duration`` with an optional leading ``-``."""
    stripped = text.strip()
    if stripped.startswith("-"):
        return -parse_duration(stripped[1:])
    return parse_duration(stripped)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no, on/off), case-insensitive."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected true or false")


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` in the largest unit ("7d")."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds}s"


def parse_replicas(text: str) -> int | None:
    """``auto`` (None) or a count of replicas, 0 or more."""
    value = text.strip().lower()
    if value == "auto":
        return None
    if not value.isdigit():
        raise ValueError("expected auto or a number of replicas")
    return int(value)


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


_PARSERS: dict[str, Callable[[str], object]] = {
    "str": str,
    "int": int,
    "float": float,
    "duration": parse_duration,
    "signed_duration": parse_signed_duration,
    "bool": parse_bool,
    "list": _parse_list,
    "replicas": parse_replicas,
}


_EXPECTED: dict[Callable[[str], object], str] = {
    int: "an integer",
    float: "a number",
    parse_duration: "a duration such as 250ms, 30s, 15m, 24h or 7d",
    parse_signed_duration: "a duration such as 30s or -2d",
    parse_bool: "true or false",
    parse_replicas: "auto or a number of replicas (0, 1, 2, ...)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every non-secret field (default None: env, then default)."""
    for opt in options():
        if opt.flag is None:
            continue
        parser.add_argument(
            opt.flag,
            dest=opt.name,
            default=None,
            metavar=opt.name.split("_")[-1].upper(),
            help=f"{opt.doc} [env {opt.env}; default {opt.default_text}]".replace("%", "%%"),
        )


def load(flags: Mapping[str, Any], environ: Mapping[str, str]) -> ServiceConfig:
    """The configuration from flags (``None`` = not given), then the environment."""
    values: dict[str, object] = {}
    for opt in options():
        raw = flags.get(opt.name)
        source = opt.flag
        if raw is None and opt.env in environ:
            raw, source = environ[opt.env], opt.env
        if raw is None:
            continue
        try:
            values[opt.name] = opt.parse(str(raw))
        except ValueError:
            expected = _EXPECTED.get(opt.parse, "a value")
            raise ConfigError(f"{source}: invalid value, expected {expected}") from None
    config = ServiceConfig(**values)  # type: ignore[arg-type]
    validate(config)
    return config


def split_address(address: str, what: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` or ``[IPv6]:PORT``; ConfigError otherwise."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT with a port from 0 to 65535")
    return host, int(port)


def validate(config: ServiceConfig, *, require_backend: bool = True) -> None:
    """Raise ConfigError for the first rule ``config`` breaks."""
    if require_backend and not config.backend:
        raise ConfigError(
            "no backend chosen: pass --backend or set MC_BACKEND to one of " + ", ".join(BACKENDS)
        )
    if config.backend and config.backend not in BACKENDS:
        raise ConfigError(
            "unknown backend: MC_BACKEND/--backend must be one of " + ", ".join(BACKENDS)
        )
    if config.backend == "redis" and not config.redis_url:
        raise ConfigError("the redis backend needs MC_REDIS_URL")
    if config.backend == "scylla" and not config.scylla_contact_points:
        raise ConfigError(
            "the scylla backend needs MC_SCYLLA_CONTACT_POINTS/--scylla-contact-points"
        )
    if config.scylla_send_path not in SCYLLA_SEND_PATHS:
        raise ConfigError("MC_SCYLLA_SEND_PATH/--scylla-send-path must be auto, driver or direct")
    config.scylla_node_routes()  # raises ConfigError for a malformed route
    if bool(config.scylla_tls_cert) != bool(config.scylla_tls_key):
        raise ConfigError("MC_SCYLLA_TLS_CERT and MC_SCYLLA_TLS_KEY go together")
    if config.scylla_tls_cert and not config.scylla_tls_ca:
        raise ConfigError("MC_SCYLLA_TLS_CERT needs MC_SCYLLA_TLS_CA (the cluster's CA)")
    for name in ("scylla_tls_ca", "scylla_tls_cert", "scylla_tls_key"):
        path = getattr(config, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"MC_{name.upper()}: file not found or not a file")
    split_address(config.grpc_address, "MC_GRPC_ADDRESS/--grpc-address")
    split_address(config.http_address, "MC_HTTP_ADDRESS/--http-address")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ConfigError("TLS needs both MC_TLS_CERT and MC_TLS_KEY")
    if config.tls_client_ca and not config.tls_cert:
        raise ConfigError("MC_TLS_CLIENT_CA (mutual TLS) needs MC_TLS_CERT and MC_TLS_KEY")
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(config, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"MC_{name.upper()}: file not found or not a file")
    if logging.getLevelName(config.log_level.upper()) not in (10, 20, 30, 40):
        raise ConfigError("MC_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError("MC_LOG_FORMAT/--log-format must be text or json")
    if config.event_loop not in EVENT_LOOPS:
        raise ConfigError("MC_EVENT_LOOP/--event-loop must be auto, asyncio or uvloop")
    positive = (
        "idempotency_window", "history_retention", "max_message_bytes", "recovery_interval",
        "recovery_batch", "readiness_interval", "readiness_timeout", "max_inline_body_bytes",
        "max_body_ref_uri_bytes", "max_custom_type_chars", "max_history_page",
        "max_history_page_bytes", "sender_burst", "scylla_port", "redis_max_connections",
        "recovery_first_retry", "recovery_max_retry", "recovery_quarantine_after",
        "scylla_max_clock_skew", "redis_wait_timeout", "fanout_threshold", "mailbox_retention",
        "mailbox_max_entries", "subscribe_poll_interval", "relay_lease", "relay_batch",
        "relay_idle_wait", "relay_max_attempts", "relay_first_retry", "relay_max_retry",
        "relay_settle_window", "relay_outbox_retention", "relay_dead_letter_retention",
        "max_streams", "max_streams_per_user",
    )  # fmt: skip
    for name in positive:
        if getattr(config, name) <= 0:
            raise ConfigError(f"MC_{name.upper()} must be positive")
    if config.redis_max_connections < 2:
        raise ConfigError(
            "MC_REDIS_MAX_CONNECTIONS must be at least 2: the scripts share one connection,"
            " and every other call takes one of the rest"
        )
    if config.history_retention < config.idempotency_window:
        raise ConfigError(
            "MC_HISTORY_RETENTION must be at least MC_IDEMPOTENCY_WINDOW: a replayed ACK"
            " must point at a message history still holds"
        )
    split_address(config.relay_http_address, "MC_RELAY_HTTP_ADDRESS/--relay-http-address")
    if config.mailbox_dedupe_window < 3600.0:
        raise ConfigError(
            "MC_MAILBOX_DEDUPE_WINDOW must be at least 1h: the relay refuses older messages,"
            " and a shorter window would refuse entries it is still retrying"
        )
    if config.relay_busy_pause < 0 or config.relay_busy_pause > config.relay_idle_wait:
        raise ConfigError("MC_RELAY_BUSY_PAUSE must be between 0 and MC_RELAY_IDLE_WAIT")
    if config.relay_batch > 1000:
        raise ConfigError("MC_RELAY_BATCH must be at most 1000")
    if config.relay_lease < 1.0:
        raise ConfigError("MC_RELAY_LEASE must be at least 1s")
    if config.relay_max_retry < config.relay_first_retry:
        raise ConfigError("MC_RELAY_MAX_RETRY must be at least MC_RELAY_FIRST_RETRY")
    if config.recovery_max_retry < config.recovery_first_retry:
        raise ConfigError("MC_RECOVERY_MAX_RETRY must be at least MC_RECOVERY_FIRST_RETRY")
    for name in (
        "max_concurrent_rpcs",
        "recovery_grace",
        "shutdown_grace",
        "max_mentions",
        "sender_rate_per_s",
    ):
        if getattr(config, name) < 0:
            raise ConfigError(f"MC_{name.upper()} must not be negative")


def read_file(path: str) -> bytes:
    """The bytes of a configured PEM file (ConfigError when unreadable)."""
    try:
        return Path(path).read_bytes()
    except OSError:
        raise ConfigError("a configured TLS file could not be read") from None
