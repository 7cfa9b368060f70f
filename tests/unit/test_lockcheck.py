"""``toolkit.lockcheck``: setup fails when the dev install moved a locked package
(a newer grpcio-tools lifted grpcio above the lock on a clean machine, and
the generated-code check failed there)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from toolkit.lockcheck import main, moved


def test_a_locked_version_the_install_kept_is_fine_and_one_it_moved_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = metadata.version("grpcio")
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# via something\n"
        f"grpcio=={installed} \\\n    --hash=sha256:{'0' * 64}\n"
        "not-installed-anywhere==1.0 \\\n    --hash=sha256:" + "1" * 64 + "\n"
    )
    assert moved(lock) == [] and main(["lockcheck", str(lock)]) == 0
    lock.write_text(f"grpcio==0.0.1 \\\n    --hash=sha256:{'0' * 64}\n")
    assert moved(lock) == [f"grpcio: 0.0.1 -> {installed}"]
    assert main(["lockcheck", str(lock)]) == 1
    assert "moved a locked package, grpcio: 0.0.1" in capsys.readouterr().err


def test_the_projects_own_lock_holds_in_this_environment() -> None:
    assert moved(Path(__file__).parents[2] / "requirements.lock") == []
