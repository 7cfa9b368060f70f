"""The domain imports only the standard library and itself (no backend, no I/O library)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[2] / "service" / "domain"
FORBIDDEN_STDLIB = {"socket", "asyncio", "sqlite3", "http", "urllib", "subprocess", "ssl"}
COORDINATION = {"Event"}
"""What the domain may take from asyncio: waiting for another coroutine, no I/O, no loop."""


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            taken = {alias.name for alias in node.names}
            if node.module == "asyncio" and taken <= COORDINATION:
                continue
            names.add(node.module)
    return names


def test_domain_imports_nothing_outside_the_standard_library() -> None:
    modules = sorted(DOMAIN.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("service.domain") or name == "__future__":
                continue
            assert top in sys.stdlib_module_names, f"{path.name} imports {name}"
            assert top not in FORBIDDEN_STDLIB, f"{path.name} does I/O through {name}"
