"""Probes of issue 24 (bad days, second round), through public surfaces only.
Same contract as ``probes_redis``: one Outcome per tree."""

from __future__ import annotations

from pathlib import Path

from tests.ab.parts import Outcome, ProbeError, RedisServer, Serve, Tree, clean_env, run
from tests.ab.probes_redis import TENANT
from tests.ab.rpc import ack, commit, create_conversation, send, wait_health

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
