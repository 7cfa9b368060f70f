"""The source-mutation hook itself, and the catalogue's texts against today's source."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mutation.catalogue import ALL
from tests.mutation.hook import Edit, Mutant, MutantNotApplicable, install


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A throwaway package ``mutdemo`` with a module ``mutdemo.rules``."""
    root = tmp_path / "mutdemo"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "rules.py").write_text("def allowed(n: int) -> bool:\n    return n > 0\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield "mutdemo.rules"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "mutdemo" or n.startswith("mutdemo.")]:
            del sys.modules[name]


def test_a_mutated_module_is_compiled_from_the_mutated_text(package: str) -> None:
    finder = install([Edit(package, "n > 0", "n >= 0")])
    try:
        module = importlib.import_module(package)
        assert module.allowed(0) is True  # the mutant
        assert finder.loaded == {package}
    finally:
        sys.meta_path.remove(finder)
    source = Path(module.__file__ or "").read_text()
    assert "n > 0" in source  # the file on disk is untouched


def test_a_stale_mutant_fails_at_import(package: str) -> None:
    finder = install([Edit(package, "n < 0", "n <= 0")])
    try:
        with pytest.raises(MutantNotApplicable, match="found 0"):
            importlib.import_module(package)
    finally:
        sys.meta_path.remove(finder)


def test_an_imported_module_cannot_be_mutated_any_more() -> None:
    with pytest.raises(MutantNotApplicable, match="already imported"):
        install([Edit("tests.mutation.hook", "x", "y")])


def test_every_edit_must_match_exactly_as_often_as_it_says() -> None:
    assert Edit("m", "a", "b", count=2).apply("a a") == "b b"
    with pytest.raises(MutantNotApplicable):
        Edit("m", "a", "b").apply("a a")


@pytest.mark.parametrize("mutant", ALL, ids=lambda m: m.id)
def test_every_mutant_applies_to_todays_source(mutant: Mutant) -> None:
    """A catalogue entry whose text went away would be reported stale by the runner;
    this says so at once."""
    for edit in mutant.edits:
        spec = importlib.util.find_spec(edit.module)
        assert spec is not None and spec.origin is not None
        edit.apply(Path(spec.origin).read_text(encoding="utf-8"))
