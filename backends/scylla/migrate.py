"""``message-committer migrate``: create or upgrade the Scylla keyspace and tables.

    python -m backends.scylla.migrate --contact-points 10.0.0.1,10.0.0.2 \\
        --keyspace message_committer --replication NetworkTopologyStrategy:dc1=3

Credentials come from the environment only (MC_SCYLLA_USERNAME,
MC_SCYLLA_PASSWORD), never from the command line, where ``ps`` would show
them. Idempotent: re-running applies nothing new and prints the version.
Refuses (exit 2) a keyspace whose schema is newer than this release. The
replication of an existing keyspace is left as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence

from backends.scylla.backend import schema_version
from backends.scylla.schema import (
    COLUMNS_OF,
    HAS_TABLETS,
    MIGRATIONS,
    RECORD_VERSION,
    SCHEMA_SCOPE,
    SCHEMA_VERSION,
    SCHEMA_VERSION_TABLE,
    check_keyspace,
    create_keyspace,
    parse_replication,
)
from backends.scylla.session import CqlSession
from backends.scylla.upgrade import convert_release1
from service.domain.errors import StoreError, StoreSchemaError

DDL_TIMEOUT_S = 60.0


async def migrate(
    contact_points: Sequence[str],
    *,
    port: int = 9042,
    keyspace: str = "message_committer",
    replication: Mapping[str, object] | str = "SimpleStrategy:1",
    username: str | None = None,
    password: str | None = None,
    local_dc: str | None = None,
    request_timeout_s: float = 10.0,
    up_to: int = SCHEMA_VERSION,
) -> int:
    """Apply every migration newer than the keyspace's (up to ``up_to``: tests build
    an older schema with it); return the version now applied."""
    check_keyspace(keyspace)
    wanted = parse_replication(replication)
    cql = await CqlSession.connect(
        contact_points,
        port=port,
        keyspace=keyspace,
        requests=Counter(),
        username=username,
        password=password,
        local_dc=local_dc,
        consistency="QUORUM",
        serial_consistency="SERIAL",
        request_timeout_s=request_timeout_s,
    )
    try:
        return await _migrate(cql, keyspace, wanted, up_to)
    finally:
        await cql.close()


async def _migrate(
    cql: CqlSession, keyspace: str, replication: Mapping[str, str], up_to: int
) -> int:
    found = await schema_version(cql)
    if found is not None and found > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"scylla: schema version {found} is newer than this release ({SCHEMA_VERSION});"
            " refusing to touch it"
        )
    if found is None:
        tablets_off = bool(await cql.simple(HAS_TABLETS))  # only ScyllaDB has this column
        ddl = create_keyspace(keyspace, replication, tablets_off=tablets_off)
        await cql.simple(ddl, timeout_s=DDL_TIMEOUT_S, raw=True)
        await cql.simple(SCHEMA_VERSION_TABLE, timeout_s=DDL_TIMEOUT_S)
    current = found or 0
    for migration in MIGRATIONS:
        if migration.version <= current or migration.version > up_to:
            continue
        for statement in migration.statements:
            await cql.simple(statement, timeout_s=DDL_TIMEOUT_S)
        if migration.columns:
            rows = await cql.simple(COLUMNS_OF, (keyspace,))
            present = {(r["table_name"], r["column_name"]) for r in rows}
            for column in migration.columns:
                if (column.table, column.name) not in present:
                    await cql.simple(column.ddl(), timeout_s=DDL_TIMEOUT_S)
        if migration.version == 2 and current == 1:
            await convert_release1(cql)  # before the version is recorded: a re-run redoes it
        await cql.simple(RECORD_VERSION, (SCHEMA_SCOPE, migration.version, migration.description))
        current = migration.version
    return current


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="message-committer migrate",
        description="Create or upgrade the ScyllaDB schema of the message commit service.",
        epilog="Credentials: MC_SCYLLA_USERNAME / MC_SCYLLA_PASSWORD in the environment.",
    )
    parser.add_argument(
        "--contact-points",
        required=True,
        help="comma-separated hosts of the cluster",
    )
    parser.add_argument("--port", type=int, default=9042, help="CQL port (default 9042)")
    parser.add_argument("--keyspace", default="message_committer")
    parser.add_argument(
        "--replication",
        default="SimpleStrategy:1",
        help='for a new keyspace: "SimpleStrategy:N" or "NetworkTopologyStrategy:dc1=3,dc2=3"',
    )
    parser.add_argument("--local-dc", default=None, help="the local data centre, if several")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a migration; exit 0 on success, 1 when unavailable, 2 on a schema refusal."""
    args = _parser().parse_args(argv)
    points = [p.strip() for p in args.contact_points.split(",") if p.strip()]
    try:
        version = asyncio.run(
            migrate(
                points,
                port=args.port,
                keyspace=args.keyspace,
                replication=args.replication,
                username=os.environ.get("MC_SCYLLA_USERNAME") or None,
                password=os.environ.get("MC_SCYLLA_PASSWORD") or None,
                local_dc=args.local_dc,
                request_timeout_s=args.timeout,
            )
        )
    except StoreSchemaError as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 1
    print(f"keyspace {args.keyspace}: schema version {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
