"""``message-committer migrate``: prepare a backend's storage on purpose.

    message-committer migrate [--backend scylla] --contact-points H1,H2 ...   # see below
    MC_REDIS_URL=redis://... message-committer migrate --backend redis [--prefix mc]

Scylla: create or upgrade the keyspace and tables (``backends.scylla.migrate``;
``--backend scylla`` is the default, as in release 1).

Redis: initialise a new, empty deployment (its identity and shards), upgrade
release 1's layout in place, or confirm an existing deployment. The service
never does this itself: a Redis without an identity is refused at start-up,
and one that loses its identity turns NOT_SERVING, so a wiped Redis is never
mistaken for a new one. The URL comes from ``MC_REDIS_URL`` only (it may hold a
password). Exit codes: 0 done, 1 unavailable, 2 refused.

The deployment identity it prints is what the service must be told
(``MC_REDIS_DEPLOYMENT``, in its secret, or ``MC_REDIS_DEPLOYMENT_FILE``, which
this command writes): the wipe cannot take it along. With one configured, an
empty prefix has served before, so it is refused (exit 2) unless
``--new-deployment``; a prefix holding another identity is refused too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from backends.redis.keys import DEFAULT_SHARDS, MAX_SHARDS


def _redis_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="message-committer migrate --backend redis",
        description="Initialise, upgrade or check the Redis deployment of a key prefix.",
        epilog="The Redis URL comes from MC_REDIS_URL in the environment.",
    )
    parser.add_argument("--prefix", default=os.environ.get("MC_REDIS_PREFIX", "mc"))
    parser.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARDS,
        help=f"shards of a new deployment, 1-{MAX_SHARDS} (default {DEFAULT_SHARDS};"
        " fixed once initialised)",
    )
    parser.add_argument(
        "--accept-lost-shards",
        action="store_true",
        help="re-mark shards whose data was lost (a Cluster node replaced empty); their"
        " conversations start over: only after deciding the data is gone for good",
    )
    parser.add_argument(
        "--new-deployment",
        action="store_true",
        help="initialise an empty prefix although the configuration names a deployment"
        " (MC_REDIS_DEPLOYMENT/_FILE): its data is gone and a new deployment starts; the"
        " service refuses it until its configuration names the new identity",
    )
    return parser


def _expected(file: str) -> str:
    """The configured identity: MC_REDIS_DEPLOYMENT, else the file's content."""
    value = os.environ.get("MC_REDIS_DEPLOYMENT", "").strip()
    if value or not file:
        return value
    try:
        with open(file, encoding="ascii") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return ""


def _record(file: str, identity: str) -> None:
    """Write ``identity`` to the deployment file (atomically), when one is configured."""
    if not file:
        return
    temporary = f"{file}.tmp"
    with open(temporary, "w", encoding="ascii") as handle:
        handle.write(identity + "\n")
    os.replace(temporary, file)


async def _migrate_redis(args: argparse.Namespace, url: str) -> str:
    from backends.redis import open_link
    from backends.redis.deployment import initialise

    file = os.environ.get("MC_REDIS_DEPLOYMENT_FILE", "")
    expected = _expected(file)
    link = open_link(url)
    try:
        deployment, done = await initialise(
            link, args.prefix, args.shards, accept_lost_shards=args.accept_lost_shards,
            expected=expected, new_deployment=args.new_deployment,
        )  # fmt: skip
    finally:
        await link.close()
    if deployment.identity != expected:
        _record(file, deployment.identity)
    return (
        f"redis prefix {args.prefix}: {done}; {deployment.shards} shards;"
        f" deployment {deployment.identity} (the service's MC_REDIS_DEPLOYMENT)"
    )


def usage() -> str:
    """Both forms of the command and every option of each: ``migrate --help``."""
    from backends.scylla.migrate import _parser as scylla_parser

    scylla = scylla_parser()
    scylla.prog = "message-committer migrate --backend scylla"
    return "\n".join(
        [
            "usage: message-committer migrate [--backend {scylla,redis}] [options]",
            "",
            "Prepare a backend's storage on purpose; the service never does it itself.",
            "--backend scylla is the default (as in release 1). Exit codes: 0 done,",
            "1 unavailable, 2 refused.",
            "",
            "== --backend scylla",
            scylla.format_help(),
            "== --backend redis",
            _redis_parser().format_help(),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    backend = "scylla"
    if "--backend" not in args_list and {"-h", "--help"} & set(args_list):
        print(usage())
        return 0
    if "--backend" in args_list:
        at = args_list.index("--backend")
        if at + 1 >= len(args_list):
            print("migrate: --backend needs a value (redis or scylla)", file=sys.stderr)
            return 2
        backend = args_list[at + 1]
        del args_list[at : at + 2]
    if backend == "scylla":
        from backends.scylla.migrate import main as scylla_main

        return scylla_main(args_list)
    if backend != "redis":
        print("migrate: --backend must be redis or scylla", file=sys.stderr)
        return 2
    args = _redis_parser().parse_args(args_list)
    url = os.environ.get("MC_REDIS_URL", "")
    if not url:
        print("migrate: set MC_REDIS_URL to the Redis to initialise", file=sys.stderr)
        return 2
    from service.domain.errors import StoreError, StoreSchemaError

    try:
        print(asyncio.run(_migrate_redis(args, url)))
    except (ValueError, OSError) as exc:
        print(f"migrate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except StoreSchemaError as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        hint = getattr(exc, "operator_hint", "")
        print(f"migrate: {exc}{': ' + hint if hint else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
