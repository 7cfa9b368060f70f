"""The independent check: porcupine (Go) over the same history, per conversation.

The checker is the small Go program in ``toolkit/nemesis/porcupine/`` (its own
``go.mod``; porcupine comes from the Go module proxy). ``build`` compiles it once per
source version into a cache directory (``~/.cache/message-committer/nemesis`` unless
``MC_NEMESIS_CACHE`` says otherwise); ``run`` checks one history file and returns the
number of non-linearizable conversations it reported. The refusal classes it
allows come from ``outcomes.REFUSALS`` (``-refusals``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from toolkit.nemesis import outcomes

SOURCE = Path(__file__).resolve().parent / "porcupine"
BUILD_TIMEOUT_S = 300.0
CHECK_TIMEOUT_S = 900.0
_ANOMALIES = re.compile(r"^anomalies: (\d+)$", re.MULTILINE)


class PorcupineError(RuntimeError):
    """Go is missing, the build failed, or the checker could not read the history."""


@dataclass(frozen=True, slots=True)
class PorcupineResult:
    anomalies: int
    output: str


def cache_dir() -> Path:
    given = os.environ.get("MC_NEMESIS_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "message-committer" / "nemesis"


def build(cache: Path | None = None) -> Path:
    """The checker binary, built with ``go build`` unless this source version is cached."""
    files = sorted(p for p in SOURCE.iterdir() if p.suffix in (".go", ".mod", ".sum"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16]
    target = (cache or cache_dir()) / f"porcupine-check-{digest}"
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise PorcupineError("the Go toolchain ('go') is needed to build the porcupine checker")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    result = subprocess.run(
        [go, "build", "-o", str(partial), "."],
        cwd=SOURCE,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"},
        check=False,
    )
    if result.returncode != 0:
        raise PorcupineError(f"go build of the porcupine checker failed:\n{result.stderr[-4000:]}")
    partial.replace(target)
    return target


def run(history: Path, html: Path | None = None, timeout_s: float = 120.0) -> PorcupineResult:
    """Check ``history``; ``html`` gets the visualisation of the first failing conversation."""
    args = [str(build()), "-history", str(history), "-timeout", f"{timeout_s:.0f}s"]
    args += ["-refusals", outcomes.go_table()]
    if html is not None:
        args += ["-html", str(html)]
    result = subprocess.run(
        args, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False
    )
    match = _ANOMALIES.search(result.stdout)
    if result.returncode not in (0, 1) or match is None:
        raise PorcupineError(f"the porcupine checker failed: {result.stderr.strip()[-2000:]}")
    return PorcupineResult(int(match.group(1)), result.stdout)
