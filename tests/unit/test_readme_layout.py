"""The README's code-layout block matches the tree: every path it names exists, and
every package of the project (a folder with an ``__init__.py``) is named there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("service", "backends", "client", "toolkit")


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Code layout", 1)[1]
    match = re.search(r"```\n(.*?)```", section, re.S)
    assert match, "the Code layout section has no code block"
    return match.group(1)


def _named_paths(block: str) -> set[str]:
    """Paths the block names: a first column like ``service/domain/``, and the
    ``name.py`` / ``name/`` words after it, relative to the first column's folder."""
    named: set[str] = set()
    folder = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            head = line.split()[0]
            folder = head if head.endswith("/") else str(Path(head).parent) + "/"
            named.add(head.rstrip("/"))
        for word in re.findall(r"(?<![\w./-])([a-z_][\w]*(?:\.py|/))(?=[\s,:;)(+]|$)", line):
            if word == line.split()[0]:
                continue
            named.add((folder + word).rstrip("/"))
    return named


def test_every_path_the_layout_names_exists() -> None:
    missing = sorted(p for p in _named_paths(_layout_block()) if not (ROOT / p).exists())
    assert not missing, f"README's code layout names paths that do not exist: {missing}"


def test_every_package_is_in_the_layout() -> None:
    named = _named_paths(_layout_block())
    packages = sorted(
        str(init.parent.relative_to(ROOT))
        for top in PACKAGE_ROOTS
        for init in (ROOT / top).rglob("__init__.py")
        if "gen" not in init.relative_to(ROOT).parts[1:]
    )
    # a top folder counts as named when something inside it is (``toolkit/bench/``)
    tops = {p.split("/", 1)[0] for p in named}
    absent = [p for p in packages if p not in named and p not in tops]
    assert not absent, f"packages missing from README's code layout: {absent}"
