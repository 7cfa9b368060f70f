"""A deployment identity the wipe cannot take with it (issue 24 item 1).

Release 2 kept the identity only in the Redis that gets wiped: commit, stop,
FLUSHALL, ``migrate --backend redis`` (exit 0), start, and the same send was
ACKed again with a new message id. Now ``migrate`` records the identity outside
Redis (the service's configuration: a file or ``MC_REDIS_DEPLOYMENT``), refuses
an empty prefix that has served before unless ``--new-deployment``, and the
service refuses any identity but its own.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis

from service.bootstrap import BackendUnreachable, build_server, open_backend
from service.client import CommitClient
from service.config import ConfigError
from tests.e2e.conftest import BASE_CONFIG
from tests.e2e.process import run_cli
from tests.servers.redis_server import RedisServer
from tests.support import send, unique

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


async def test_a_wiped_redis_migrated_again_is_refused_not_served_as_new(
    own_redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = unique("mc-dep")
    identity_file = tmp_path / "deployment-id"
    env = {"MC_REDIS_URL": own_redis_server.url, "MC_REDIS_DEPLOYMENT_FILE": str(identity_file)}
    migrate = ["migrate", "--backend", "redis", "--prefix", prefix]
    first = run_cli(migrate, env=env)
    assert first.returncode == 0, first.stderr
    identity = identity_file.read_text().strip()
    assert len(identity) == 32 and f"deployment {identity}" in first.stdout
    assert run_cli(migrate, env=env).returncode == 0  # re-running it is safe

    config = replace(
        BASE_CONFIG,
        backend="redis",
        redis_url=own_redis_server.url,
        redis_prefix=prefix,
        redis_deployment_file=str(identity_file),
    )
    request = send(unique("t"))
    server = build_server(config, await open_backend(config))
    await server.start()
    try:
        async with CommitClient.connect(f"127.0.0.1:{server.grpc_port}") as client:
            await client.create_conversation(request.tenant, "c1", ["alice", "bob"])
            await client.commit(request)
    finally:
        await server.stop(grace_s=0.5)

    admin = Redis.from_url(own_redis_server.url)
    try:
        await admin.flushall()
        again = run_cli(migrate, env=env)  # what compose's migrate-redis does on `up`
        assert again.returncode == 2, again.stdout
        assert "--new-deployment" in again.stderr and own_redis_server.url not in again.stderr
        assert await admin.dbsize() == 0  # nothing initialised
        with pytest.raises(ConfigError, match="no deployment is initialised"):
            await open_backend(config)

        told = {**env, "MC_REDIS_DEPLOYMENT_FILE": "", "MC_REDIS_DEPLOYMENT": identity}
        started_over = run_cli([*migrate, "--new-deployment"], env=told)
        assert started_over.returncode == 0, started_over.stderr
        assert identity not in started_over.stdout  # a new identity
        secret = replace(config, redis_deployment_file="", redis_deployment=identity)
        with pytest.raises(BackendUnreachable) as refused:  # its secret names the old one
            await open_backend(secret)
        assert "StoreWiped" in str(refused.value)
    finally:
        await admin.aclose()
