"""The terminal chat, as a person would use it: two chats in tmux against a real
``serve`` process, typed into with send-keys and read back with capture-pane."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.support import TENANT
from tests.e2e.process import ServeProcess, command, run_cli

pytestmark = pytest.mark.e2e
SCREEN_TIMEOUT_S = 30.0


class Tmux:
    """A private tmux server (its own socket), one session per chat."""

    def __init__(self) -> None:
        found = shutil.which("tmux")
        if found is None:
            pytest.fail("tmux is missing: scripts/setup.sh installs it", pytrace=False)
        self.tmux = found
        self.socket = f"mc-chat-{uuid.uuid4().hex[:8]}"

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [self.tmux, "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return done.stdout

    def start(self, name: str, argv: list[str]) -> None:
        self.run(
            "new-session", "-d", "-s", name, "-x", "120", "-y", "40", subprocess.list2cmdline(argv)
        )

    def type(self, name: str, line: str) -> None:
        self.run("send-keys", "-t", name, "-l", line)
        self.run("send-keys", "-t", name, "Enter")

    def screen(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", name)

    def wait_for(self, name: str, text: str, timeout_s: float = SCREEN_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            screen = self.screen(name)
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not on {name}'s screen:\n{self.screen(name)}")

    def alive(self, name: str) -> bool:
        done = subprocess.run(
            [self.tmux, "-L", self.socket, "has-session", "-t", name],
            capture_output=True,
            check=False,
            timeout=10,
        )
        return done.returncode == 0

    def close(self) -> None:
        subprocess.run(
            [self.tmux, "-L", self.socket, "kill-server"],
            capture_output=True,
            check=False,
            timeout=10,
        )


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux()
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    process = ServeProcess(["--subscribe-poll-interval", "50ms", "--relay-idle-wait", "50ms"])
    try:
        yield process
    finally:
        if process.process.poll() is None:
            process.process.send_signal(signal.SIGCONT)
        process.close()


def chat(serve: ServeProcess, tmp_path: Path, user: str) -> list[str]:
    return [
        *command(),
        "chat",
        "--tenant",
        TENANT,
        "--as",
        user,
        "--conversation",
        "general",
        "--target",
        serve.target,
        "--db",
        str(tmp_path / f"{user}.sqlite3"),
    ]


def test_two_people_chat_in_two_terminals(serve: ServeProcess, tmux: Tmux, tmp_path: Path) -> None:
    create = "conversation create --conversation general --member alice --member bob"
    made = run_cli([*create.split(), "--target", serve.target, "--tenant", TENANT])
    assert made.returncode == 0, made.stderr
    tmux.start("alice", chat(serve, tmp_path, "alice"))
    tmux.start("bob", chat(serve, tmp_path, "bob"))
    tmux.wait_for("alice", "· online")
    tmux.wait_for("bob", "· online")

    tmux.type("alice", "hi bob, it's alice")
    tmux.wait_for("alice", "✓ #1 alice: hi bob, it's alice")
    tmux.wait_for("bob", "  #1 alice: hi bob, it's alice")
    tmux.type("bob", "hello alice")
    tmux.wait_for("bob", "✓ #2 bob: hello alice")
    tmux.wait_for("alice", "  #2 bob: hello alice")

    serve.process.send_signal(signal.SIGSTOP)  # the server hangs: the send stays pending
    tmux.type("alice", "are you still there?")
    screen = tmux.wait_for("alice", "… alice: are you still there?")
    time.sleep(1.0)
    assert "#3" not in tmux.screen("alice"), screen
    serve.process.send_signal(signal.SIGCONT)
    tmux.wait_for("alice", "✓ #3 alice: are you still there?")
    tmux.wait_for("bob", "  #3 alice: are you still there?")
    assert tmux.screen("bob").count("are you still there?") == 1

    tmux.type("alice", "/quit")
    tmux.type("bob", "/quit")
    deadline = time.monotonic() + 10
    while (tmux.alive("alice") or tmux.alive("bob")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tmux.alive("alice") and not tmux.alive("bob")


def _wait_in(path: Path, texts: list[str], timeout_s: float = SCREEN_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = path.read_text(errors="replace")
        if all(t in out for t in texts):
            return out
        time.sleep(0.1)
    raise AssertionError(f"{texts!r} not in the chat's output:\n{path.read_text()}")


def test_lines_that_arrive_together_are_all_sent(serve: ServeProcess, tmp_path: Path) -> None:
    """Two lines in one read (pasted, or piped from a script): both go out at once,
    not only the first (issue 22, item 10)."""
    create = "conversation create --conversation general --member alice --member bob"
    made = run_cli([*create.split(), "--target", serve.target, "--tenant", TENANT])
    assert made.returncode == 0, made.stderr
    out = tmp_path / "alice.out"
    with out.open("wb") as sink:
        process = subprocess.Popen(
            chat(serve, tmp_path, "alice"), stdin=subprocess.PIPE, stdout=sink, stderr=sink
        )
    assert process.stdin is not None
    try:
        _wait_in(out, ["· online"])
        process.stdin.write(b"first of two\nsecond of two\n")  # one write, stdin stays open
        process.stdin.flush()
        _wait_in(out, ["✓ #1 alice: first of two", "✓ #2 alice: second of two"])
        process.stdin.write(b"/quit\n")
        process.stdin.flush()
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        process.stdin.close()
