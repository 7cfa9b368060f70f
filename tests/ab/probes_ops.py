"""Probes of what an operator meets: configuration that should be refused, a Redis
that evicts or loses its data, Scylla's serial consistency and a fast replica
on Scylla. Same contract as ``probes_redis``: one Outcome per tree.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ab.parts import Outcome, ProbeError, RedisServer, Serve, Tree, clip, run, setup_redis
from tests.ab.probes_redis import FAST_CLOCK, TENANT, ack_text, clock_ahead_s
from tests.ab.rpc import ack, commit, create_conversation, health, send, wait_health

CQL_CONTACT = os.environ.get("MC_AB_CQL_CONTACT", "127.0.0.1:40011")
READINESS_S = 0.5


def _first_line(server: Serve, *words: str) -> str:
    """The first log line naming one of ``words`` (else the last line), shortened."""
    for line in server.log().splitlines():
        if any(w in line for w in words):
            return clip(line.split(": ", 1)[-1])
    return clip(server.last_line())


# --- 3b. retention shorter than the idempotency window ---------------------------------


def short_retention_config(tree: Tree, work: Path) -> Outcome:
    """History retention shorter than the idempotency window must be refused: a
    replayed ACK would point at a message history no longer holds."""
    args = ["--backend", "memory", "--history-retention", "1d", "--idempotency-window", "7d"]
    server = Serve(tree, args, log_path=work / "serve.log")
    try:
        served = server.try_start()
        status = health(server.target) if served else ""
    finally:
        server.stop()
    if served:
        return Outcome(False, f"accepted: served ({status}) with retention 1d < window 7d")
    line = _first_line(server, "RETENTION", "retention")
    held = server.exit_code == 2 and "retention" in line.lower()
    return Outcome(held, f"refused, exit {server.exit_code}: {line}")


# --- 5. a Redis that evicts, a Redis that lost its data ---------------------------------


def evicting_redis(tree: Tree, work: Path) -> Outcome:
    """``maxmemory-policy allkeys-lru``: serve must refuse to start (exit 3)."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)  # initialised as usual, then switched to evicting
        redis.admin.config_set("maxmemory-policy", "allkeys-lru")
        server = Serve(tree, ["--backend", "redis"], {"MC_REDIS_URL": redis.url},
                       log_path=work / "serve.log")  # fmt: skip
        try:
            served = server.try_start()
            status = health(server.target) if served else ""
        finally:
            server.stop()
    if served:
        return Outcome(False, f"started and {status} on an allkeys-lru Redis")
    line = _first_line(server, "maxmemory", "evict")
    held = server.exit_code == 3 and "maxmemory-policy" in line
    return Outcome(held, f"exit {server.exit_code}: {line}")


def wiped_redis(tree: Tree, work: Path) -> Outcome:
    """FLUSHALL under a running server: NOT_SERVING within two readiness intervals,
    and no silent start-over at seq 1."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        args = ["--backend", "redis", "--readiness-interval", f"{int(READINESS_S * 1000)}ms"]
        with Serve(tree, args, {"MC_REDIS_URL": redis.url}, log_path=work / "serve.log") as s:
            if not create_conversation(s.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            for n in (1, 2):
                if not commit(s.target, send(TENANT, "c1", f"wipe-{n}", "before")).ok:
                    raise ProbeError("a commit before the wipe failed")
            before, _ = wait_health(s.target, "SERVING", 5)
            redis.admin.flushall()
            slack = 1.0  # grpc-health-probe's own start and connect
            status, seconds = wait_health(s.target, "NOT_SERVING", 2 * READINESS_S + slack)
            again = create_conversation(s.target, TENANT, "c1", "alice", "bob")
            after = commit(s.target, send(TENANT, "c1", "wipe-3", "after"))
    restart = f"seq={ack(after)[0]}" if after.ok else f"{after.code}"
    held = before == "SERVING" and status == "NOT_SERVING" and not after.ok
    return Outcome(held, f"{status} {seconds:.1f}s after FLUSHALL (interval {READINESS_S}s);"
                         f" re-create {again.code}, next commit {restart} (was seq 2)")  # fmt: skip


# --- 6. Scylla's serial consistency -------------------------------------------------------


def serial_default(tree: Tree, work: Path) -> Outcome:
    """``serve --help``: conditional writes on Scylla must default to SERIAL."""
    helped = run([tree.cli, "serve", "--help"], timeout=60)
    flat = " ".join(helped.stdout.split())
    local = re.search(r"default LOCAL_SERIAL\]", flat)
    serial = re.search(r"SERIAL \(the default\)|default SERIAL\]", flat)
    found = local or serial
    if found is None:
        raise ProbeError("serve --help names no serial consistency default")
    flag = re.findall(r"(--scylla-[a-z-]+)", flat[: found.start()])
    said = f"serve --help: {flag[-1] if flag else '?'} ... {found.group(0).rstrip(']')}"
    return Outcome(local is None, said)


# --- 2s. a fast clock on Scylla -----------------------------------------------------------


@contextmanager
def fresh_keyspace(tree: Tree) -> Iterator[list[str]]:
    """A keyspace of its own on the shared CQL node, migrated by ``tree``: yields the
    ``serve`` arguments that reach it; the keyspace is dropped afterwards."""
    host, _, port = CQL_CONTACT.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        raise ProbeError(f"no CQL node at {CQL_CONTACT} (MC_AB_CQL_CONTACT); start one with"
                         " deploy/cassandra/cassandra_node.py") from None  # fmt: skip
    keyspace = f"ab_{uuid.uuid4().hex[:12]}"
    migrated = run([tree.cli, "migrate", "--contact-points", host, "--port", port,
                    "--keyspace", keyspace, "--replication", "SimpleStrategy:1"],
                   timeout=300)  # fmt: skip
    if migrated.returncode != 0:
        raise ProbeError(f"migrate failed: {(migrated.stderr or migrated.stdout)[-200:]}")
    try:
        yield ["--backend", "scylla", "--scylla-contact-points", host, "--scylla-port", port,
               "--scylla-keyspace", keyspace]  # fmt: skip
    finally:
        _drop_keyspace(host, int(port), keyspace)


def fast_clock_scylla(tree: Tree, work: Path) -> Outcome:
    """As the Redis probe, on the shared CQL node (a fresh keyspace): the fast
    replica must replay the first ACK or refuse to serve at all."""
    with fresh_keyspace(tree) as scylla:
        args = [*scylla, "--idempotency-window", "2d", "--recovery-interval", "1h"]
        right = Serve(tree, args, log_path=work / "right.log")
        ahead = Serve(tree, args, {"FAKETIME_DONT_FAKE_MONOTONIC": "1"},
                      ["faketime", "-f", FAST_CLOCK], work / "ahead.log")  # fmt: skip
        with right:
            if not create_conversation(right.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            request = send(TENANT, "c1", "clock-1", "first")
            first = commit(right.target, request)
            if not first.ok:
                raise ProbeError(f"the first commit failed: {first}")
            try:
                if not ahead.try_start():
                    line = clip(_first_line(ahead, "clock", "skew").split(": ")[-1], 90)
                    again = commit(right.target, request)
                    held = again.ok and ack(again) == ack(first)
                    return Outcome(held, f"{FAST_CLOCK} replica refused to start (exit "
                                         f"{ahead.exit_code}: {line}); right replica then "
                                         f"{ack_text(again, first)}")  # fmt: skip
                if clock_ahead_s(ahead) < 2.5 * 86400:
                    raise ProbeError("faketime did not move the replica's clock")
                retry = commit(ahead.target, request, timeout=30)
            finally:
                ahead.stop()
            again = commit(right.target, request)
    same = retry.ok and ack(retry) == ack(first) and again.ok and ack(again) == ack(first)
    return Outcome(same, f"first seq={ack(first)[0]}; retry via {FAST_CLOCK} replica "
                         f"{ack_text(retry, first)}; right replica then "
                         f"{ack_text(again, first)}")  # fmt: skip


def _drop_keyspace(host: str, port: int, keyspace: str) -> None:
    """The probe's keyspace goes again (the node itself is shared and stays up)."""
    from cassandra.cluster import Cluster

    cluster = Cluster([host], port=port)
    try:
        cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    except Exception as exc:  # left behind under a fresh name: harmless, say so
        print(f"note: keyspace {keyspace} was not dropped ({type(exc).__name__})")
    finally:
        cluster.shutdown()
