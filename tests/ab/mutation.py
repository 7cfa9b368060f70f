"""Probe 7: the fake-ACK mutant of issue 11, against each tree's own tests.

In a copy of the tree, the committer's ``_drive`` answers a store that refuses
mid-commit (its ``except StoreError`` branch, which raises Recoverable) with
the intent's ACK instead. The tree's own memory conformance suite and fault
campaign smoke then run against the copy (with the tree's venv, the copy
first on the path). The promise holds when the mutant is killed by a test
that passes without the mutation.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.ab.parts import Outcome, ProbeError, Tree, clean_env, run
from tests.ab.trees import copy_of

COMMITTER = Path("service/domain/committer.py")
SUITES: dict[str, tuple[str, ...]] = {
    "conformance -m memory": ("tests/conformance", "-m", "memory"),
    "campaign smoke": ("tests/campaign/test_fault_campaign.py", "-m", "not redis and not scylla"),
}
_BRANCH = re.compile(
    r"(?P<head>\n(?P<indent>[ ]+)except StoreError as exc:[^\n]*\n)"
    r"(?P=indent)[ ]+raise self\._recoverable\([^\n]*\n"
)
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
SUITE_TIMEOUT_S = 600.0


def mutate(source: str) -> str:
    """``source`` with the fake-ACK mutation in ``_drive``; ProbeError if absent."""
    start = source.find("async def _drive(")
    end = source.find("\n    async def ", start + 1)
    if start < 0:
        raise ProbeError("no _drive in the committer")
    end = len(source) if end < 0 else end
    body = source[start:end]
    match = _BRANCH.search(body)
    if match is None:
        raise ProbeError("no 'except StoreError' branch raising Recoverable in _drive")
    mutated = (
        body[: match.start()]
        + match.group("head")
        + f"{match.group('indent')}    return intent.committed_message()  # MUTANT: fake ACK\n"
        + body[match.end() :]
    )
    return source[:start] + mutated + source[end:]


def _pytest(tree: Tree, cwd: Path, args: tuple[str, ...], path: Path | None) -> tuple[int, str]:
    env = clean_env({"PYTHONPATH": str(path)} if path else None)
    done = run([tree.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *args],
               env=env, cwd=cwd, timeout=SUITE_TIMEOUT_S)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def fake_ack_mutant(tree: Tree, work: Path) -> Outcome:
    copy = copy_of(tree, work / "mutant")
    target = copy / COMMITTER
    target.write_text(mutate(target.read_text()))
    env = clean_env({"PYTHONPATH": str(copy)})
    where = run([tree.python, "-c", "import service.domain.committer as m; print(m.__file__)"],
                env=env, cwd=copy, timeout=60)  # fmt: skip
    if not where.stdout.strip().startswith(str(copy)):
        raise ProbeError(f"the mutant copy is not what imports: {where.stdout.strip()[:120]}")
    killers: list[str] = []
    summaries: list[str] = []
    for name, suite in SUITES.items():
        code, output = _pytest(tree, copy, suite, copy)
        if code not in (0, 1):
            raise ProbeError(f"pytest {name} could not run (exit {code}): {output[-200:]}")
        killers += _FAILED.findall(output)
        summaries.append(f"{name} {_summary(output)}")
    if not killers:
        return Outcome(False, "mutant survives: " + "; ".join(summaries))
    code, output = _pytest(tree, tree.root, tuple(sorted(set(killers))), None)
    if code != 0:
        raise ProbeError(f"the killing tests fail without the mutation too: {_summary(output)}")
    names = ", ".join(k.rsplit("/", 1)[-1] for k in sorted(set(killers)))
    return Outcome(True, f"mutant killed by {len(set(killers))}: {names}")


def _summary(output: str) -> str:
    """What pytest's last line counts ("83 passed, 1 failed"), without deselections
    and time."""
    lines = [line.strip("= ") for line in output.splitlines() if line.strip()]
    last = lines[-1].split(" in ")[0] if lines else "(no output)"
    return ", ".join(part for part in last.split(", ") if "deselected" not in part)
