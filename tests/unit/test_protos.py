"""The protos: generated code is current, buf lint (STANDARD) passes, the check catches drift."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_generate() -> ModuleType:
    """protos/generate.py is a script, not a package module: load it by path."""
    spec = importlib.util.spec_from_file_location(
        "protos_generate", ROOT / "protos" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generate()


def test_committed_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "protos/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_check_reports_a_stale_or_missing_file(tmp_path: Path) -> None:
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    generate.generate(fresh)
    shutil.copytree(fresh, committed)
    assert generate.stale_files(fresh, committed) == []
    stub = committed / "message_committer" / "v1" / "committer_pb2.pyi"
    stub.write_text(stub.read_text() + "# edited by hand\n")
    (committed / "message_committer" / "v1" / "membership_pb2.py").unlink()
    assert generate.stale_files(fresh, committed) == [
        "message_committer/v1/committer_pb2.pyi",
        "message_committer/v1/membership_pb2.py",
    ]


def test_generated_imports_point_into_service_gen(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    grpc_module = (tmp_path / "message_committer" / "v1" / "committer_pb2_grpc.py").read_text()
    assert "from service.gen.message_committer.v1 import committer_pb2" in grpc_module
    assert "'/message_committer.v1.MessageCommitterService/Commit'" in grpc_module  # wire name kept


def _buf() -> str | None:
    local = ROOT / ".tools" / "node_modules" / ".bin" / "buf"
    return str(local) if local.exists() else shutil.which("buf")


def test_buf_lint_standard_passes() -> None:
    buf = _buf()
    if buf is None:
        pytest.fail("buf is not installed: run scripts/install-tools.sh (make test does)")
    result = subprocess.run(
        [buf, "lint"], cwd=ROOT / "protos", capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    config = (ROOT / "protos" / "buf.yaml").read_text()
    assert "STANDARD" in config and "except" not in config and "ignore" not in config


def test_buf_breaking_against_release_1_passes() -> None:
    """The protos stay additive to release 1 (its .proto files, vendored in
    protos/releases/r1 exactly as 148ccc3 shipped them)."""
    buf = _buf()
    if buf is None:
        pytest.fail("buf is not installed: run scripts/install-tools.sh (make test does)")
    snapshot = ROOT / "protos" / "releases" / "r1" / "message_committer" / "v1"
    assert {p.name for p in snapshot.glob("*.proto")} == {"committer.proto", "membership.proto"}
    result = subprocess.run(
        [buf, "breaking", "--against", "releases/r1"],
        cwd=ROOT / "protos",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_catches_a_removed_field(tmp_path: Path) -> None:
    """The check is real: a copy of release 1 with a field removed breaks it."""
    buf = _buf()
    if buf is None:
        pytest.fail("buf is not installed: run scripts/install-tools.sh (make test does)")
    shutil.copytree(ROOT / "protos" / "releases" / "r1", tmp_path / "old")
    shutil.copytree(ROOT / "protos" / "releases" / "r1", tmp_path / "new")
    proto = tmp_path / "new" / "message_committer" / "v1" / "committer.proto"
    text = proto.read_text()
    proto.write_text(text.replace("  string reply_to = 8;\n", "", 1))
    assert proto.read_text() != text
    result = subprocess.run(
        [buf, "breaking", str(tmp_path / "new"), "--against", str(tmp_path / "old")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "reply_to" in result.stdout + result.stderr
