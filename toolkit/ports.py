"""Free loopback ports for the servers the tests, campaigns and benches start.

The usual trick, bind port 0 and close, hands out a port from the kernel's
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by
default). Every outgoing connection takes its local port from that same range, so
between the close and the server's own bind, a client socket anywhere on the
machine (a CQL driver, a gRPC channel, another test worker) can take the port and
the server exits with "address in use". A suite that starts hundreds of servers
while thousands of connections come and go hits that now and then.

``free_port`` picks from below the ephemeral range instead, where only an explicit
bind can land, checks the port (and any companion ``port + offset``, such as a
Redis Cluster node's bus port) is bindable, and reserves it with an advisory lock
file under the temp directory, so two processes picking at the same moment never
get the same number. A process holds its last ``HELD`` reservations (a long
campaign starts thousands of servers; the oldest are long gone when released), and
the locks go with the process.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOW = 10_000  # below this: well-known and registered services
HELD = 512
TRIES = 500
_held: collections.deque[int] = collections.deque()
_rng = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (connect, bind to 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def _candidates(offsets: tuple[int, ...]) -> range:
    """Ports ``p`` such that every ``p + offset`` lies outside the ephemeral range."""
    eph_low, eph_high = ephemeral_range()
    reach = max(offsets)
    below = range(LOW, eph_low - reach)
    above = range(eph_high + 1, 65_536 - reach)
    return below if len(below) >= len(above) else above


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def lock_dir() -> Path:
    """Where the reservations' lock files live (shared by every process of a user)."""
    return Path(tempfile.gettempdir()) / "mc-ports"


def _lock(port: int) -> int | None:
    """An open descriptor holding ``port``'s lock file, or None when another holds it."""
    folder = lock_dir()
    folder.mkdir(exist_ok=True)
    fd = os.open(folder / str(port), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _hold(fd: int) -> None:
    _held.append(fd)
    while len(_held) > HELD:
        with contextlib.suppress(OSError):
            os.close(_held.popleft())  # closing releases the lock


def free_port(host: str = "127.0.0.1", offsets: tuple[int, ...] = (0,)) -> int:
    """A port ``p`` on ``host`` where ``p + o`` is free for each ``o`` in ``offsets``,
    outside the ephemeral range and reserved for this process (see the module
    docstring). Also the right answer for "a port nothing listens on"."""
    pool = _candidates(offsets)
    if not pool:
        raise RuntimeError("no port range outside the kernel's ephemeral range")
    for _ in range(TRIES):
        port = _rng.choice(pool)
        fds: list[int] = []
        for offset in offsets:
            fd = _lock(port + offset)
            if fd is None or not _bindable(host, port + offset):
                if fd is not None:
                    os.close(fd)
                break
            fds.append(fd)
        if len(fds) == len(offsets):
            for fd in fds:
                _hold(fd)
            return port
        for fd in fds:
            os.close(fd)
    raise RuntimeError(f"no free port on {host} after {TRIES} tries")
