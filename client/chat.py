"""``message-committer chat``: a line-oriented terminal chat on the client runtime.

::

    message-committer chat --tenant acme --as alice --conversation general

Type a line and Enter to send it. What it prints:

======================  ==========================================================
line                    meaning
======================  ==========================================================
``… alice: hi``         your send, stored locally and not yet confirmed
``✓ #3 alice: hi``      your send, committed as message 3 of the conversation
``  #4 bob: hello``     a message received (from the mailbox or history)
``✗ not sent (...)``    the server refused your send for good; it is kept, parked
``· online``            the connection state and other runtime events
======================  ==========================================================

Commands: ``/pending``, ``/history`` (one older page from the server),
``/help``, ``/quit`` (or end of input). The local store is a SQLite file
(``--db``; by default under ``$XDG_DATA_HOME/message-committer/``), so a send
made while the server is down is kept and goes out when it is back.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from client import (
    ClientRuntime,
    ClientRuntimeError,
    ConnectionChanged,
    ConnectRequest,
    CursorExpired,
    EventsDropped,
    GrpcConnector,
    LocalMessage,
    LocalStoreReset,
    MessagesAdded,
    Origin,
    RebuildFinished,
    RebuildStarted,
    SendConfirmed,
    SendFailed,
    SendMessage,
    open_local_store,
)
from client.events import ClientEvent
from client.model import new_client_message_id
from service.domain.model import Direction, HistoryQuery, MessageContent, MessageType
from service.tasks import cancel_and_wait

PROG = "message-committer chat"
HELP = "type a message and Enter to send; /pending, /history, /help, /quit"


def default_db(tenant: str, user: str, device: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "message-committer" / f"chat-{tenant}-{user}-{device}.sqlite3"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="A terminal chat on the client runtime.")
    p.add_argument("--tenant", required=True)
    p.add_argument("--as", dest="user", required=True, help="the user you chat as")
    p.add_argument("--conversation", required=True)
    p.add_argument("--device", default="terminal", help="this device's id [terminal]")
    p.add_argument(
        "--target",
        default=os.environ.get("MC_TARGET", "127.0.0.1:50051"),
        help="HOST:PORT of the server [env MC_TARGET; default 127.0.0.1:50051]",
    )
    p.add_argument("--db", default="", help="the local store (a SQLite file)")
    p.add_argument("--last", type=int, default=20, help="messages shown at start [20]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return asyncio.run(Chat(args).run())
    except ClientRuntimeError as exc:
        print(f"{PROG}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def body_text(content: MessageContent) -> str:
    if content.body_ref is not None:
        return f"<{content.message_type.value} by reference, {content.body_ref.size_bytes} B>"
    if content.message_type is MessageType.TEXT:
        return content.body.decode("utf-8", "replace")
    kind = content.custom_type or content.message_type.value
    return f"<{kind}, {len(content.body)} B>"


class StdinLines:
    """Every complete line of what is readable on ``fd`` now, in order (a paste or
    a script's pipe brings several in one read; a buffered ``readline`` would
    keep all but the first until more input came); None at the end of input."""

    def __init__(self, fd: int, lines: asyncio.Queue[str | None]) -> None:
        self.fd = fd
        self.lines = lines
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.partial = ""
        self.ended = False

    def ready(self) -> None:
        if self.ended:
            return
        data = os.read(self.fd, 65536)
        text = self.partial + self.decoder.decode(data, final=not data)
        *complete, self.partial = text.split("\n")
        for line in complete:
            self.lines.put_nowait(line + "\n")
        if not data:
            if self.partial:
                self.lines.put_nowait(self.partial)
                self.partial = ""
            self.ended = True
            self.lines.put_nowait(None)


class Chat:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conversation: str = args.conversation
        self.user: str = args.user
        self.stop = asyncio.Event()
        self.oldest = 0
        self.texts: dict[str, str] = {}
        """Bodies of this device's unconfirmed sends, by cmid (for the ✓ line)."""

    def say(self, line: str) -> None:
        print(line, flush=True)

    def line_of(self, message: LocalMessage, mark: str = " ") -> str:
        r = message.record
        where = "" if r.conversation == self.conversation else f"[{r.conversation}] "
        return f"{mark} {where}#{r.seq} {r.sender}: {body_text(r.content)}"

    async def run(self) -> int:
        a = self.args
        db = Path(a.db) if a.db else default_db(a.tenant, a.user, a.device)
        store = await open_local_store(db)
        runtime = ClientRuntime(store, GrpcConnector(a.target))
        await runtime.connect(ConnectRequest(a.tenant, a.user, a.device))
        self.say(f"chat: {a.user} in {a.tenant}/{self.conversation} via {a.target}; {HELP}")
        for message in await store.messages(self.conversation, limit=a.last):
            self.say(self.line_of(message, "✓" if message.record.sender == a.user else " "))
            self.oldest = self.oldest or message.seq
        for p in await store.pending():
            self.texts[p.cmid] = body_text(p.send.content)
            self.say(f"… {a.user}: {self.texts[p.cmid]}" + (" (parked)" if p.parked else ""))
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGINT, self.stop.set)
            loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        loop.add_reader(sys.stdin.fileno(), StdinLines(sys.stdin.fileno(), lines).ready)
        printer = asyncio.create_task(self.print_events(runtime))
        try:
            await self.read_lines(runtime, lines)
        finally:
            loop.remove_reader(sys.stdin.fileno())
            await runtime.close()
            await cancel_and_wait(printer)
        self.say("bye")
        return 0

    async def read_lines(self, runtime: ClientRuntime, lines: asyncio.Queue[str | None]) -> None:
        stopping = asyncio.create_task(self.stop.wait())
        try:
            while not self.stop.is_set():
                getting = asyncio.create_task(lines.get())
                await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    return
                line = getting.result()
                if line is None or line.strip() == "/quit":
                    return
                await self.handle(runtime, line.rstrip("\n"))
        finally:
            stopping.cancel()

    async def handle(self, runtime: ClientRuntime, line: str) -> None:
        text = line.strip()
        if not text:
            return
        if text == "/help":
            self.say(f"· {HELP}")
        elif text == "/pending":
            pending = await runtime.store.pending()
            for p in pending:
                state = f"parked: {p.problem}" if p.parked else f"{p.attempts} attempt(s)"
                self.say(f"… {body_text(p.send.content)} ({state})")
            self.say(f"· {len(pending)} pending")
        elif text == "/history":
            await self.older(runtime)
        elif text.startswith("/"):
            self.say(f"· unknown command; {HELP}")
        else:
            content = MessageContent(MessageType.TEXT, text.encode())
            cmid = new_client_message_id(self.args.device)
            message = SendMessage(self.conversation, content, cmid)
            self.texts[message.cmid] = text
            try:
                await runtime.send_message(message)
            except ClientRuntimeError as exc:
                self.texts.pop(message.cmid, None)
                self.say(f"✗ not sent ({type(exc).__name__}: {exc})")
                return
            self.say(f"… {self.user}: {text}")

    async def older(self, runtime: ClientRuntime) -> None:
        query = HistoryQuery("", self.conversation, "", Direction.BACKWARD, self.oldest, 20)
        try:
            page = await runtime.pull_history(query)
        except ClientRuntimeError as exc:
            self.say(f"· history unavailable ({type(exc).__name__})")
            return
        for r in reversed(page.records):
            self.say(self.line_of(LocalMessage(r, Origin.HISTORY)))
        if page.next_anchor:  # past the records the user may not read too (hidden_seqs)
            self.oldest = page.next_anchor
        elif page.records:
            self.oldest = min(r.seq for r in page.records)
        self.say(f"· {len(page.records)} older message(s)")

    async def print_events(self, runtime: ClientRuntime) -> None:
        while True:
            try:
                event = await runtime.next_event()
            except ClientRuntimeError:
                return
            if isinstance(event, SendConfirmed):
                await self.confirmed(runtime, event)
                continue
            for line in self.describe(event):
                self.say(line)

    async def confirmed(self, runtime: ClientRuntime, event: SendConfirmed) -> None:
        m = event.message
        text = self.texts.pop(event.cmid, None)
        if text is None:  # sent before this session
            own = await runtime.store.find_own(self.user, event.cmid)
            text = body_text(own.record.content) if own else "(sent)"
        where = "" if m.conversation == self.conversation else f"[{m.conversation}] "
        self.say(f"✓ {where}#{m.seq} {self.user}: {text}")

    def describe(self, event: ClientEvent) -> list[str]:
        if isinstance(event, MessagesAdded):
            return [self.line_of(m) for m in event.messages]
        if isinstance(event, SendFailed):
            return [f"✗ not sent ({event.error}: {event.message}); kept as parked"]
        if isinstance(event, ConnectionChanged):
            return [f"· {event.state.value}" + (f" ({event.reason})" if event.reason else "")]
        if isinstance(event, CursorExpired):
            return [f"· the {event.lane} cursor expired ({event.why}): rebuilding"]
        if isinstance(event, RebuildStarted):
            return [f"· rebuilding {len(event.plan.conversations)} conversation(s)"]
        if isinstance(event, RebuildFinished):
            return [f"· rebuilt: {event.backfilled} message(s) backfilled"]
        if isinstance(event, LocalStoreReset):
            return [f"· local store reset ({event.reason}); {event.kept_pending} pending kept"]
        if isinstance(event, EventsDropped):
            return [f"· {event.count} event(s) dropped"]
        return []
