"""toolkit/ports.py: ports for test servers come from outside the kernel's ephemeral
range (where any outgoing connection can take a port between a bind-to-0 probe and
the server's own bind), are bindable, and are never handed to two pickers at once."""

import random
import socket
from pathlib import Path

import pytest

from toolkit import ports


def _first_pick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, port: int) -> None:
    """The next pick tries ``port`` first, then random ones; locks in ``tmp_path`` only
    (so what other processes reserved meanwhile does not matter)."""
    picks = [port]
    fallback = random.Random()
    monkeypatch.setattr(ports, "lock_dir", lambda: tmp_path)
    monkeypatch.setattr(
        ports._rng, "choice", lambda pool: picks.pop() if picks else fallback.choice(pool)
    )


def test_a_port_and_its_companions_lie_outside_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    for offsets in ((0,), (0, 10_000)):
        port = ports.free_port(offsets=offsets)
        for offset in offsets:
            assert not low <= port + offset <= high, (port, offset, low, high)


def test_a_reserved_port_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ports, "lock_dir", lambda: tmp_path)
    first = ports.free_port()
    _first_pick(monkeypatch, tmp_path, first)
    assert ports.free_port() != first  # its lock file is held (a flock per open file)


def test_a_port_bound_by_someone_else_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = ports.free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        _first_pick(monkeypatch, tmp_path, port)
        assert ports.free_port() != port


def test_a_port_whose_companion_is_taken_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = ports.free_port(offsets=(0, 10_000))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port + 10_000))
        _first_pick(monkeypatch, tmp_path, port)
        assert ports.free_port(offsets=(0, 10_000)) != port
