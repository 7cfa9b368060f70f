"""Probes of issue 24 (bad days, second round), through public surfaces only.
Same contract as ``probes_redis``: one Outcome per tree."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

from tests.ab.parts import (
    Outcome,
    ProbeError,
    RedisServer,
    Serve,
    Tree,
    clean_env,
    commit_of,
    run,
    setup_redis,
    unfinished,
)
from tests.ab.probes_ops import fresh_keyspace
from tests.ab.probes_redis import (
    TENANT,
    _leave_unfinished,
    _rewrite_record,
    ack_text,
    clock_ahead_s,
)
from tests.ab.rpc import Reply, ack, commit, create_conversation, recover_due, send, wait_health

READINESS_S = 0.5


def eviction_set_at_run_time(tree: Tree, work: Path) -> Outcome:
    """``CONFIG SET maxmemory-policy allkeys-lru`` on a serving Redis: after the
    next probe a Commit must be refused (UNAVAILABLE), not ACKed."""
    with RedisServer(work / "redis") as redis:
        run([tree.cli, "migrate", "--backend", "redis"],
            env=clean_env({"MC_REDIS_URL": redis.url}), timeout=60)  # fmt: skip
        args = ["--backend", "redis", "--readiness-interval", f"{int(READINESS_S * 1000)}ms"]
        with Serve(tree, args, {"MC_REDIS_URL": redis.url}, log_path=work / "serve.log") as s:
            if not create_conversation(s.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            redis.admin.config_set("maxmemory-policy", "allkeys-lru")
            status, _ = wait_health(s.target, "NOT_SERVING", 4 * READINESS_S + 1.0)
            after = commit(s.target, send(TENANT, "c1", "lru-1", "after"))
    held = not after.ok and after.code == "UNAVAILABLE"
    return Outcome(held, f"health {status}; Commit {after}")


def wiped_and_migrated_again(tree: Tree, work: Path) -> Outcome:
    """Commit, stop, FLUSHALL, ``migrate --backend redis``, start: the same send
    must never be ACKed with a new message id (refused, or the original)."""
    identity = work / "deployment-id"
    with RedisServer(work / "redis") as redis:
        env = {"MC_REDIS_URL": redis.url, "MC_REDIS_DEPLOYMENT_FILE": str(identity)}
        run([tree.cli, "migrate", "--backend", "redis"], env=clean_env(env), timeout=60)
        request = send(TENANT, "c1", "wiped-1", "first")
        with Serve(tree, ["--backend", "redis"], env, log_path=work / "serve-1.log") as s:
            if not create_conversation(s.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            first = commit(s.target, request)
            if not first.ok:
                raise ProbeError(f"the first commit failed: {first}")
        redis.admin.flushall()
        again = run([tree.cli, "migrate", "--backend", "redis"], env=clean_env(env), timeout=60)
        server = Serve(tree, ["--backend", "redis"], env, log_path=work / "serve-2.log")
        try:
            if not server.try_start():
                return Outcome(True, f"migrate exit {again.returncode}; serve exit"
                                     f" {server.exit_code}")  # fmt: skip
            create_conversation(server.target, TENANT, "c1", "alice", "bob")
            retried = commit(server.target, request)
        finally:
            server.stop()
    same = retried.ok and ack(retried) == ack(first)
    seen = f"seq={ack(retried)[0]} new id" if retried.ok and not same else str(retried)
    return Outcome(not retried.ok or same, f"migrate exit {again.returncode}; retry {seen}")


def quarantine_has_an_end(tree: Tree, work: Path) -> Outcome:
    """Issue 24 item 7: an undecodable intent is quarantined (RecoverDue), then
    ``message-committer quarantine abandon``: a retry of its send must get a
    definite FAILED_PRECONDITION (not UNAVAILABLE, retry forever) and no seq of
    the conversation may stay pinned against retention."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        args = ["--backend", "redis", "--recovery-interval", "1h"]
        with Serve(tree, args, {"MC_REDIS_URL": redis.url}, log_path=work / "serve.log") as s:
            if not create_conversation(s.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            _leave_unfinished(redis, s.target, ["poison-1"])
            _rewrite_record(redis, "poison-1", y="hologram")  # a type a newer release may write
            if not commit(s.target, send(TENANT, "c1", "fine-1", "fine")).ok:
                raise ProbeError("the commit after the poison failed")
            recovered = recover_due(s.target)  # release 1: the poison fails the whole run
            abandoned = run(
                [tree.cli, "quarantine", "abandon", "--target", s.target, "--tenant", TENANT,
                 "--sender", "alice", "--cmid", "poison-1", "--reason", "a/b probe"],
                env=clean_env({}), timeout=60,
            )  # fmt: skip
            retried = commit(s.target, send(TENANT, "c1", "poison-1", "body of poison-1"))
        pinned = sum(redis.admin.zcard(k) for k in redis.admin.scan_iter(match="*:p:ab:c1"))
    held = abandoned.returncode == 0 and retried.code == "FAILED_PRECONDITION" and pinned == 0
    return Outcome(held, f"RecoverDue {'OK' if recovered.ok else recovered.code};"
                         f" abandon exit {abandoned.returncode}; retry {retried};"
                         f" pinned {pinned}")  # fmt: skip


NESTING = 100_000


def nested_json_intent(tree: Tree, work: Path) -> Outcome:
    """Issue 24 item 5: an unfinished intent whose record JSON nests 100,000 deep
    (json raises RecursionError, not a decode error), oldest in the queue:
    RecoverDue must still finish the two others."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        args = ["--backend", "redis", "--recovery-interval", "1h"]
        with Serve(tree, args, {"MC_REDIS_URL": redis.url}, log_path=work / "serve.log") as s:
            if not create_conversation(s.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            _leave_unfinished(redis, s.target, ["deep-1"])
            time.sleep(0.05)  # the deep one is the oldest by a clear margin
            _leave_unfinished(redis, s.target, ["fine-1", "fine-2"])
            key, fields = commit_of(redis.admin, "deep-1")
            deep = fields[b"r"].rstrip(b"}") + b',"z":' + b"[" * NESTING + b"]" * NESTING + b"}"
            redis.admin.hset(key, "r", deep)
            recovered = recover_due(s.target)
        left = unfinished(redis.admin)
    held = recovered.ok and left == 1  # only the deep one is left
    answer = "OK" if recovered.ok else recovered.code
    return Outcome(held, f"RecoverDue {answer}; unfinished after it: {left} of 3")


def orphaned_queue_members(tree: Tree, work: Path) -> Outcome:
    """Issue 24 item 6: 200 recovery-queue members whose commit hash is gone, at
    the head of the queue (older than a real unfinished intent): RecoverDue must
    finish the real one and remove the orphans (release 1 skipped them forever)."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        args = ["--backend", "redis", "--recovery-interval", "1h"]
        with Serve(tree, args, {"MC_REDIS_URL": redis.url}, log_path=work / "serve.log") as s:
            if not create_conversation(s.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            _leave_unfinished(redis, s.target, ["real-1"])
            queues = _queues_naming(redis, b"real-1")
            if not queues:
                raise ProbeError("no recovery-queue zset names the unfinished intent")
            for zset, member, score in queues:  # same layout, a cmid nobody wrote
                orphans = {member.replace(b"real-1", f"orphan-{i}".encode()): score - 1 - i
                           for i in range(200)}  # fmt: skip
                redis.admin.zadd(zset, orphans)
            rounds = [recover_due(s.target, max_items=50) for _ in range(3)]
        left = unfinished(redis.admin)
        orphans_left = sum(len(_orphans(redis, z)) for z, _, _ in queues)
    held = all(r.ok for r in rounds) and left == 0 and orphans_left == 0
    codes = "/".join("OK" if r.ok else r.code for r in rounds)
    return Outcome(held, f"RecoverDue x3 {codes}; unfinished {left}; orphans left {orphans_left}")


def _queues_naming(redis: RedisServer, cmid: bytes) -> list[tuple[bytes, bytes, float]]:
    found = []
    for zset in redis.admin.scan_iter(count=1000, _type="ZSET"):
        pairs = cast(list[tuple[bytes, float]], redis.admin.zrange(zset, 0, -1, withscores=True))
        for member, score in pairs:
            if member.endswith(b":" + cmid):
                found.append((zset, member, float(score)))
    return found


def _orphans(redis: RedisServer, zset: bytes) -> list[bytes]:
    members = cast(list[bytes], redis.admin.zrange(zset, 0, -1))
    return [m for m in members if b":orphan-" in m]


# --- items 3 and 4: a replica's clock against the backend's ---------------------------

DAY_MS = 86_400_000
JUMP = "+8d"  # beyond the default 7-day idempotency window (and any skew bound)
FAKETIME_LIBRARIES = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/faketime/libfaketime.so.1"),
)
JUMP_SEEN_S = 15.0


def _adjustable_clock(rc: Path) -> dict[str, str]:
    """The environment of a process whose wall clock follows ``rc`` (a libfaketime
    spec such as ``+0`` or ``+8d``, re-read at least once a second), monotonic
    time untouched: the clock can jump while the process runs."""
    library = next((p for p in FAKETIME_LIBRARIES if p.exists()), None)
    if library is None:
        raise ProbeError("libfaketime.so.1 not found (apt-get install -y faketime)")
    rc.parent.mkdir(parents=True, exist_ok=True)
    rc.write_text("+0\n")
    return {"LD_PRELOAD": str(library), "FAKETIME_TIMESTAMP_FILE": str(rc),
            "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # fmt: skip


def _server_ms(reply: Reply) -> int:
    return int(reply.data.get("message", {}).get("server_ts_ms", 0))


def _uuid7_ms(message_id: str) -> int:
    """The time of a UUIDv7-layout message id (its first 48 bits)."""
    return int(message_id.replace("-", "")[:12], 16) if message_id else 0


def _wait_for_jump(target: str) -> Reply:
    """Commits of fresh keys (conversation c2) until one succeeds with a server time
    that shows the jump, bounded: that replica's clock has moved. A tick may fail
    while the clock jumps (the CQL driver times a request in flight out by the wall
    clock); it is only the probe's step, so the next tick takes a new key."""
    deadline = time.monotonic() + JUMP_SEEN_S
    last = "no tick"
    for n in range(int(JUMP_SEEN_S * 4)):
        tick = commit(target, send(TENANT, "c2", f"tick-{n}", "tick"))
        if tick.ok and _server_ms(tick) > time.time() * 1000 + 7 * DAY_MS:
            return tick
        last = str(tick) if not tick.ok else f"server_ts_ms {_server_ms(tick)}"
        if time.monotonic() > deadline:
            break
        time.sleep(0.25)
    raise ProbeError(f"no commit showed the {JUMP} jump within {JUMP_SEEN_S:.0f}s (last: {last})")


def clock_jumps_after_open(tree: Tree, work: Path) -> Outcome:
    """Issue 24 item 3, Scylla: a replica serves with a right clock, commits a send,
    then its clock jumps 8 days (past the 7-day window) before any readiness probe
    runs. A retry of the ACKed send through it must be refused or get the same ACK
    (release 1 judged the key expired and re-reserved it: a new seq), and a right
    replica must still answer the first ACK (nothing was written over it)."""
    rc = work / "faketime.rc"
    clock = _adjustable_clock(rc)
    with fresh_keyspace(tree) as scylla:
        quiet = [*scylla, "--readiness-interval", "1h", "--recovery-interval", "1h"]
        jumper = Serve(tree, quiet, clock, log_path=work / "jumper.log")
        right = Serve(tree, quiet, log_path=work / "right.log")
        with jumper, right:
            for conversation in ("c1", "c2"):
                if not create_conversation(jumper.target, TENANT, conversation, "alice", "bob").ok:
                    raise ProbeError("CreateConversation failed")
            request = send(TENANT, "c1", "jump-1", "first")
            first = commit(jumper.target, request)
            if not first.ok:
                raise ProbeError(f"the first commit failed: {first}")
            rc.write_text(f"{JUMP}\n")
            _wait_for_jump(jumper.target)
            retry = commit(jumper.target, request, timeout=30)
            again = commit(right.target, request)
    kept = again.ok and ack(again) == ack(first)
    held = (not retry.ok or ack(retry) == ack(first)) and kept
    return Outcome(held, f"first seq={ack(first)[0]}; after a {JUMP} jump the retry"
                         f" {ack_text(retry, first)}; right replica then"
                         f" {ack_text(again, first)}")  # fmt: skip


def ack_time_of_a_fast_replica(tree: Tree, work: Path) -> Outcome:
    """Issue 24 item 4, Redis: a replica 8 days ahead (libfaketime) commits a send.
    The ACK's server_ts_ms and the message id's time must be Redis's time (TIME),
    not the replica's clock (release 1: 8 days in the future)."""
    with RedisServer(work / "redis") as redis:
        setup_redis(tree, redis.url)
        args = ["--backend", "redis", "--recovery-interval", "1h"]
        env = {"MC_REDIS_URL": redis.url, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        with Serve(tree, args, env, ["faketime", "-f", JUMP], work / "ahead.log") as ahead:
            if clock_ahead_s(ahead) < 7 * 86400:
                raise ProbeError("faketime did not move the replica's clock")
            if not create_conversation(ahead.target, TENANT, "c1", "alice", "bob").ok:
                raise ProbeError("CreateConversation failed")
            acked = commit(ahead.target, send(TENANT, "c1", "ahead-1", "from the future"))
            seconds, micros = redis.admin.time()
    if not acked.ok:
        return Outcome(False, f"Commit via a {JUMP} replica answered {acked}")
    redis_ms = int(seconds) * 1000 + int(micros) // 1000
    ts_off = (_server_ms(acked) - redis_ms) / 1000
    id_off = (_uuid7_ms(ack(acked)[1]) - redis_ms) / 1000
    held = abs(ts_off) < 60 and abs(id_off) < 60
    return Outcome(held, f"{JUMP} replica: ACK server_ts_ms {ts_off:+.0f}s and message-id time"
                         f" {id_off:+.0f}s off Redis TIME")  # fmt: skip
