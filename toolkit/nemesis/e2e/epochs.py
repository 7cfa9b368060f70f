"""The e2e fault ``new-epoch``: an operator starts the next epoch of a user's inbox.

What ``message-committer mailbox-new-epoch`` does (``service/new_epoch.py``), in the
nemesis's own process: ``LaneEpochs`` opens the run's backend with the serve
processes' flags and environment (through the storage proxies, like them) and
calls the mailbox store's ``new_epoch`` on the inbox of the target user. Proven
like the other faults: the lane's epoch, read before the fault and again after it
began, must have grown (``proven``; ``no-effect`` otherwise). Every device and lane
reader holding a cursor of the old epoch must then be answered CursorExpired and
rebuild: the ``silent-epoch`` rule of ``lanes.py``, and the delivery rules, judge it.
"""

from __future__ import annotations

import argparse
import logging
import os

from service import config as service_config
from service.bootstrap import open_backend
from service.domain.delivery import MailboxStore
from service.domain.mailbox import Mailbox
from service.domain.ports import Backend


class LaneEpochs:
    def __init__(self, serve_args: list[str], serve_env: dict[str, str], tenant: str) -> None:
        self._args = serve_args
        self._env = serve_env
        self._tenant = tenant
        self._backend: Backend | None = None
        self._before: dict[str, int] = {}

    async def store(self) -> MailboxStore:
        if self._backend is None:
            parser = argparse.ArgumentParser()
            service_config.add_arguments(parser)
            flags = vars(parser.parse_args(self._args))
            config = service_config.load(flags, {**os.environ, **self._env})
            bootstrap = logging.getLogger("service.bootstrap")
            level = bootstrap.level  # its warnings are for serve's operator, said in
            bootstrap.setLevel(logging.ERROR)  # the replicas' logs already
            try:
                self._backend = await open_backend(config)
            finally:
                bootstrap.setLevel(level)
        delivery = self._backend.delivery
        if delivery is None or not delivery.shared:
            raise RuntimeError("this backend's mailboxes live inside serve")
        return delivery.mailbox

    def inbox(self, user: str) -> Mailbox:
        return Mailbox.inbox(self._tenant, user)

    async def epoch(self, user: str) -> int:
        store = await self.store()
        (state,) = await store.lane_state([self.inbox(user)])
        return state.epoch

    async def begin(self, user: str) -> None:
        """Start the next epoch of ``user``'s inbox (its epoch before is kept for the proof)."""
        self._before[user] = await self.epoch(user)
        await (await self.store()).new_epoch(self.inbox(user))

    async def prove(self, user: str) -> tuple[bool, str]:
        """Whether the inbox's epoch grew since ``begin``, and the evidence."""
        now = await self.epoch(user)
        before = self._before.get(user)
        if before is None:
            return False, f"inbox of {user}: no new epoch began (epoch {now})"
        return now > before, f"inbox of {user}: epoch {before} -> {now}"

    async def close(self) -> None:
        if self._backend is not None:
            await self._backend.close()
            self._backend = None
