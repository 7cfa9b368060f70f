"""Exit 1 when an installed package differs from its version in a pip lock file.

``scripts/setup.sh`` installs requirements.lock (exact versions, hashes), then
the project's dev extras on top; this checks that the second install kept
every locked version, and names each one it moved.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def moved(lock: Path) -> list[str]:
    """``name: locked -> installed`` for every locked package installed at another version."""
    found = []
    for line in lock.read_text().splitlines():
        match = PINNED.match(line)
        if match is None:
            continue
        name, locked = match.groups()
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # a platform-specific pin this machine does not use
        if installed != locked:
            found.append(f"{name}: {locked} -> {installed}")
    return found


def main(argv: list[str]) -> int:
    lock = Path(argv[1] if len(argv) > 1 else "requirements.lock")
    changes = moved(lock)
    for change in changes:
        print(f"setup: the dev install moved a locked package, {change}", file=sys.stderr)
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
