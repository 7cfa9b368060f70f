"""``MC_REDIS_WAIT_REPLICAS``: which answers wait for replicas before they are given.

Redis replicates asynchronously, and during a failover two servers can take writes
for a while (a paused primary resumes before Sentinel demotes it). An answer that
rests on stored state is only safe to give once the state is on a server that will
survive the failover, so with ``replicas > 0``:

* a **committed result** (fresh, replayed or re-read) waits: the commit's own WAIT,
  or a barrier (a one-key write + WAIT on one connection; when replicas hold it,
  they hold everything before it);
* a **replay** is answered by the reserve script, and ``write`` sends that script,
  the barrier and WAIT in one pipeline on one connection: one round trip, and the
  replicas that acknowledge are those of the server that answered (a barrier sent
  as a second call could reach the new primary after a failover, while a resumed
  stale primary answered "committed" for a commit the failover lost). A fresh
  reservation carries the same barrier but its count is not checked: it rests on
  nothing stored before it, and the commit's own WAIT decides the ACK. A re-read
  outside reserve (``load_commit``, recovery) sends its barrier as a call of its
  own (``confirm``);
* a **definite refusal** that rests on stored state waits too (with reserve's
  barrier, or its own): an idempotency conflict, "no such conversation" and "not
  a member". Otherwise a send whose first attempt reserved on the new primary (the
  replica acknowledgement timed out) could be refused by the old one on its retry,
  and then be committed by recovery: the sender was told "refused" for a message
  that exists (the nemesis found exactly this, ``refused-took-effect``);
* the **relay's record read** waits the same way (``read_commands``: the reads, a
  barrier and WAIT on one connection): the relay delivers only a record the replicas
  hold. A record read from a primary alone (a send whose WAIT failed) and appended
  after a failover to the new primary, which never had it, left a mailbox entry for a
  message that does not exist; the sender's retry then committed the same key under
  another message id (the Sentinel delivery soak: "another message id than its
  ACK's");
* a **History page** waits: the page's script, a barrier and WAIT go in one
  pipeline on one connection, so the replicas that acknowledge hold what the page
  shows *on the server that answered it*. A page served by a resumed primary
  before its demotion could otherwise show a send whose WAIT failed; the failover
  loses it and gives its seq to another message, and a device that stored the
  page holds a message that never existed (the e2e nemesis, seed 3117).

Fewer replicas than asked for raise StoreNotReplicated: recoverable, retry the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.redis.keys import KeySpace
from backends.redis.link import Arg, RedisLink
from backends.redis.lua import Script
from service.domain.errors import StoreNotReplicated


class Replication:
    def __init__(self, link: RedisLink, keys: KeySpace, replicas: int, wait_ms: int) -> None:
        self.link = link
        self.keys = keys
        self.replicas = replicas
        self.wait_ms = wait_ms

    def check(self, acked: int) -> None:
        """StoreNotReplicated unless ``acked`` replicas acknowledged."""
        if acked < self.replicas:
            raise StoreNotReplicated(
                f"redis: {acked} of the {self.replicas} replicas MC_REDIS_WAIT_REPLICAS asks"
                " for acknowledged in time"
            )

    async def confirm(self, tenant: str, conversation: str, acked: int | None = None) -> None:
        """A barrier on the conversation's shard: replicas hold what was read there.
        ``acked``: the count of the barrier that already went with the script that
        answered (``write``), only checked."""
        if acked is not None:
            self.check(acked)
        elif self.replicas:
            shard = self.keys.conversation(tenant, conversation).shard
            self.check(await self.link.replication_barrier(shard.barrier, self.replicas,
                                                           self.wait_ms))  # fmt: skip

    async def read(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], barrier: str
    ) -> Any:
        """A reading script whose answer rests on state replicas must hold: with
        ``replicas > 0`` the script, an INCR of ``barrier`` (a key of its shard) and
        WAIT in one pipeline on one connection; without, the script alone."""
        if not self.replicas:
            return await self.link.script(script, keys, args, write=False)
        reply, acked = await self.link.script_and_wait(
            script, keys, args, self.replicas, self.wait_ms, barrier=barrier
        )
        self.check(acked)
        return reply

    async def read_commands(self, commands: Sequence[Sequence[Arg]], barrier: str) -> list[Any]:
        """Plain reads (keys of ``barrier``'s shard) whose answer must rest on what
        replicas hold: with ``replicas > 0`` the reads, an INCR of ``barrier`` and WAIT
        in one pipeline on one connection; without, the reads alone (one round trip
        either way)."""
        if not self.replicas:
            return await self.link.pipeline(commands, write=False)
        replies, acked = await self.link.reads_and_wait(
            commands, barrier, self.replicas, self.wait_ms
        )
        self.check(acked)
        return replies

    async def write(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], barrier: str
    ) -> tuple[Any, int | None]:
        """A writing script whose answer may rest on stored state (reserve): with
        ``replicas > 0`` the script, an INCR of ``barrier`` (a key of its shard) and
        WAIT in one pipeline on one connection, errors translated as a write's
        (outcome unknown). Returns the reply and the replicas that acknowledged
        (None without replicas: the script alone), which the caller checks
        (``confirm(..., acked)``) only for an answer that rests on stored state."""
        if not self.replicas:
            return await self.link.script(script, keys, args), None
        return await self.link.script_and_wait(
            script, keys, args, self.replicas, self.wait_ms, barrier=barrier, write=True
        )
