"""Source mutation at import time, for the hand-made mutation campaigns.

A mutant replaces one exact piece of text in one module's source (a Lua
script kept as a string in ``backends/redis/*.py``, a CQL statement or a
decision of ``backends/scylla/*.py``, a line of the domain or the memory
backend). ``install`` puts a finder in front of ``sys.meta_path`` that
compiles the named modules from the mutated text when they are first
imported; the files on disk are never touched and no bytecode is written.

Production code has no hook for this: the finder exists only in a test
process that asked for it (``tests/mutation/plugin.py``, loaded with
``pytest -p tests.mutation.plugin``), and only for the modules it names.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal


class MutantNotApplicable(RuntimeError):
    """The text a mutant replaces is not in its module (exactly as often as
    expected): the catalogue is stale for this source."""


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace ``old`` by ``new`` in ``module``'s source, ``count`` times exactly."""

    module: str
    old: str
    new: str
    count: int = 1

    def apply(self, source: str) -> str:
        found = source.count(self.old)
        if found != self.count:
            raise MutantNotApplicable(
                f"{self.module}: expected {self.count} occurrence(s) of {self.old!r}, found {found}"
            )
        return source.replace(self.old, self.new)


Kind = Literal["lua", "cql", "python"]
Promise = Literal["ACK", "seq", "conflict", "recovery", "authorisation", "delivery"]


@dataclass(frozen=True, slots=True)
class Mutant:
    """One hand-made mutant: what it breaks (``promise``) and how (``edits``)."""

    id: str
    kind: Kind
    promise: Promise
    what: str
    edits: tuple[Edit, ...]


class _MutatedLoader(importlib.abc.Loader):
    def __init__(self, origin: str, edits: Sequence[Edit]) -> None:
        self._origin = origin
        self._edits = edits

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        source = Path(self._origin).read_text(encoding="utf-8")
        for edit in self._edits:
            source = edit.apply(source)
        exec(compile(source, self._origin, "exec"), module.__dict__)


class MutatingFinder(importlib.abc.MetaPathFinder):
    """Finds the mutated modules the normal way, then loads them from mutated text."""

    def __init__(self, edits: Sequence[Edit]) -> None:
        self._edits: dict[str, list[Edit]] = {}
        for edit in edits:
            self._edits.setdefault(edit.module, []).append(edit)
        self.loaded: set[str] = set()

    @property
    def modules(self) -> set[str]:
        return set(self._edits)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        edits = self._edits.get(fullname)
        if edits is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise MutantNotApplicable(f"{fullname}: no Python source to mutate")
        # Check now, so a stale mutant fails at import with a clear message.
        source = Path(spec.origin).read_text(encoding="utf-8")
        for edit in edits:
            source = edit.apply(source)
        spec.loader = _MutatedLoader(spec.origin, edits)
        spec.cached = None
        self.loaded.add(fullname)
        return spec


def install(edits: Sequence[Edit]) -> MutatingFinder:
    """Mutate ``edits``' modules on their first import; raise if one is imported already."""
    early = sorted(e.module for e in edits if e.module in sys.modules)
    if early:
        raise MutantNotApplicable(f"already imported, cannot be mutated: {', '.join(early)}")
    finder = MutatingFinder(edits)
    sys.meta_path.insert(0, finder)
    return finder
