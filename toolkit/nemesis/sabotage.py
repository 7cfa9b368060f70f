"""A deliberately broken build for ``nemesis --sabotage``: do the checkers see it?

The service has no switch that disables a promise. To show that the nemesis
catches a broken build, this module copies the importable packages of this
checkout into the run's work directory and edits the copy; the replicas then
run ``python -m service.cli`` from there, so the copy shadows the installed
packages. The checkout itself is never changed.

``identity``: a reserve treats every stored identity as this send's, so a
conflicting reuse of a committed key is answered with the original ACK (and a
lost duplicate can take another send's coordinates): both checkers must report it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("service", "backends", "toolkit")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


@dataclass(frozen=True, slots=True)
class Edit:
    path: str
    original: str
    broken: str


EDITS: dict[str, Edit] = {
    "identity": Edit(
        "service/domain/model.py",
        "        return identity.matches(self, stored)\n",
        "        return True  # nemesis --sabotage identity: every stored identity matches\n",
    ),
}


class SabotageError(RuntimeError):
    """This checkout's source no longer has the line a sabotage edits."""


def broken_build(repo: Path, work: Path, kind: str) -> Path:
    """A copy of ``repo``'s packages under ``work`` with sabotage ``kind`` applied."""
    edit = EDITS[kind]
    root = work / f"broken-build-{kind}"
    if root.exists():
        shutil.rmtree(root)
    for package in PACKAGES:
        shutil.copytree(repo / package, root / package, ignore=IGNORE)
    target = root / edit.path
    source = target.read_text()
    if source.count(edit.original) != 1:
        raise SabotageError(
            f"--sabotage {kind}: {edit.path} no longer has the line it breaks; update"
            " toolkit/nemesis/sabotage.py"
        )
    target.write_text(source.replace(edit.original, edit.broken))
    return root
