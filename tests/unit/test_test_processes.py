"""The suite's own process wrappers: a serve that fails to start closes its log file.
Left open, the file was closed by the garbage collector, whose ResourceWarning (in a
reference cycle, the file object can be finalized before its wrapper) then failed
whichever later test the collection ran in."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import process


def test_a_serve_that_does_not_start_closes_and_removes_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Any] = []
    original = tempfile.NamedTemporaryFile

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", recording)
    with pytest.raises(RuntimeError, match="serve did not start") as failed:
        process.ServeProcess(argv0=[sys.executable, "-c", "print('no serving line')"])
    assert "no serving line" in str(failed.value)
    assert [(f.closed, Path(f.name).exists()) for f in made] == [(True, False)]
