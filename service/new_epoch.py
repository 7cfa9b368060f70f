"""``message-committer mailbox-new-epoch``: start a lane's next epoch on purpose.

    message-committer mailbox-new-epoch --backend redis --tenant T --user U
    message-committer mailbox-new-epoch --backend redis --tenant T --conversation C

For an operator who restored a backend from a backup, or knows a lane lost
entries its clients already applied (a failover without
``MC_REDIS_WAIT_REPLICAS``): the lane (a user's inbox, or a big
conversation's own lane) starts its next epoch, empty, so every client's
cursor answers CURSOR_EXPIRED and the client rebuilds from history; no
client-visible seq is ever reused for another entry. The fences stay, so a
deposed relay still cannot write into it. Opens the backend directly, like
``relay-dead-letters`` (the same flags and ``MC_*`` variables as ``serve``).
Exit 0, 2 for bad input or configuration, 3 when the backend does not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from service import config as service_config
from service.config import ConfigError, ServiceConfig, StartupError
from service.domain.errors import InvalidRequest
from service.domain.ids import check_id
from service.domain.mailbox import Mailbox

PROG = "message-committer mailbox-new-epoch"
OWN = ("tenant", "user", "conversation")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--tenant", required=True, help="the lane's tenant")
    owner = parser.add_mutually_exclusive_group(required=True)
    owner.add_argument("--user", help="the user whose inbox starts a new epoch")
    owner.add_argument("--conversation", help="the big conversation whose lane does")
    service_config.add_arguments(parser)
    return parser


def mailbox_of(tenant: str, user: str | None, conversation: str | None) -> Mailbox:
    """The lane named on the command line, or ConfigError (bad input, exit 2)."""
    try:
        tenant = check_id("tenant", tenant)
        if user is not None:
            return Mailbox.inbox(tenant, check_id("user", user))
        assert conversation is not None
        return Mailbox.conversation(tenant, check_id("conversation", conversation))
    except InvalidRequest as exc:
        raise ConfigError(str(exc)) from None


async def run(config: ServiceConfig, mailbox: Mailbox) -> int:
    from service.bootstrap import open_backend

    backend = await open_backend(config)
    try:
        if backend.delivery is None or not backend.delivery.shared:
            raise ConfigError("the memory backend's mailboxes live inside serve")
        store = backend.delivery.mailbox
        (before,) = await store.lane_state([mailbox])
        after = await store.new_epoch(mailbox)
        print(
            f"lane {mailbox.lane} of {mailbox.kind.name.lower()} {mailbox.owner}:"
            f" epoch {before.epoch} (head {before.head}) -> epoch {after.epoch}"
        )
        return 0
    finally:
        await backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    flags = {k: v for k, v in vars(args).items() if k not in OWN}
    try:
        mailbox = mailbox_of(args.tenant, args.user, args.conversation)
        config = service_config.load(flags, os.environ)
        return asyncio.run(run(config, mailbox))
    except StartupError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
