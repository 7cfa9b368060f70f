"""``message-committer relay-dead-letters``: list, or requeue, the relay's dead letters.

    message-committer relay-dead-letters --backend redis            # list them all
    message-committer relay-dead-letters --backend redis --requeue  # deliver them again

Opens the backend directly, like ``migrate`` (the same flags and ``MC_*``
variables as ``serve``). Lists every partition's dead letters, one line
each: partition, letter id, tenant, conversation, seq, message id, attempts
and the problem (never a message body: an outbox entry has none).
``--requeue`` moves each back into its partition as a new pending entry; the
relays deliver it, and mailboxes dedupe by message id, so a message that was
delivered after all is not added twice. The last line counts the letters
held; the relays drop letters older than MC_RELAY_DEAD_LETTER_RETENTION
(default 30 d), counted in ``message_committer_relay_dead_letters_trimmed_total``.
Exit 0, 2 for bad configuration, 3 when the backend does not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from service import config as service_config
from service.config import ConfigError, ServiceConfig, StartupError

PROG = "message-committer relay-dead-letters"
PAGE = 500
MAX_PAGES = 10_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requeue", action="store_true", help="move every dead letter back into its partition"
    )
    service_config.add_arguments(parser)
    return parser


async def run(config: ServiceConfig, requeue: bool) -> int:
    from service.bootstrap import open_backend

    backend = await open_backend(config)
    try:
        if backend.delivery is None or not backend.delivery.shared:
            raise ConfigError("the memory backend's dead letters live inside serve")
        partitions = backend.delivery.partitions
        total = moved = 0
        for partition in partitions.partitions():
            after = ""
            letters: list[str] = []
            for _ in range(MAX_PAGES):
                page, after = await partitions.dead_letters(partition, after, PAGE)
                for d in page:
                    e = d.entry
                    print(
                        f"{partition} {d.letter} tenant={e.tenant} conversation={e.conversation}"
                        f" seq={e.seq} message_id={e.message_id} attempts={d.attempts}"
                        f" problem={d.problem!r}"
                    )
                letters += [d.letter for d in page]
                if not after:
                    break
            total += len(letters)
            if requeue and letters:
                moved += await partitions.requeue(partition, letters)
        print(f"dead letters: {total}" + (f", requeued: {moved}" if requeue else ""))
        return 0
    finally:
        await backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    requeue = bool(args.requeue)
    flags = {k: v for k, v in vars(args).items() if k != "requeue"}
    try:
        config = service_config.load(flags, os.environ)
        return asyncio.run(run(config, requeue))
    except StartupError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
