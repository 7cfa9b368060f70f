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
from tests.ab.probes_redis import TENANT, _leave_unfinished, _rewrite_record
from tests.ab.rpc import ack, commit, create_conversation, recover_due, send, wait_health

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
