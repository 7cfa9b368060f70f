"""The two trees of the A/B: an old revision checked out beside this one, each
with its own venv, and throwaway copies of either for a mutation.

The old tree is a detached ``git worktree`` under the work directory with a
venv of its own (``pip install -e '.[dev]'``, so pip's cache makes a rebuild
quick). It is kept for the next run (a marker in the venv names the commit it
was built for) unless ``fresh`` asks for a rebuild.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.ab.parts import ProbeError, Tree, run

HERE = Path(__file__).resolve().parents[2]
READY = ".ab-ready"
_SKIPPED = (".venv", ".git", ".tools", "__pycache__", ".mypy_cache", ".ruff_cache",
            ".pytest_cache", "*.egg-info")  # fmt: skip


def current() -> Tree:
    """This tree (the one the command runs from), with its own venv."""
    tree = Tree("new", HERE)
    if not tree.cli.exists():
        raise ProbeError("this tree has no .venv: run scripts/setup.sh first")
    return tree


def git(*args: str, cwd: Path = HERE, timeout: float = 120.0) -> str:
    done = run(["git", *args], cwd=cwd, timeout=timeout)
    if done.returncode != 0:
        raise ProbeError(f"git {args[0]} failed: {done.stderr.strip()[:200]}")
    return done.stdout.strip()


def old_tree(rev: str, workdir: Path, *, fresh: bool = False) -> Tree:
    """``rev`` checked out in ``workdir/trees/<sha>`` with a ready venv."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    root = workdir / "trees" / sha[:12]
    marker = root / ".venv" / READY
    if not fresh and marker.exists() and marker.read_text().strip() == sha:
        return Tree(f"old ({sha[:7]})", root)
    if root.exists():
        run(["git", "worktree", "remove", "--force", str(root)], cwd=HERE, timeout=120)
        shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    run(["git", "worktree", "prune"], cwd=HERE, timeout=120)
    git("worktree", "add", "--detach", str(root), sha)
    made = run(["python3", "-m", "venv", str(root / ".venv")], timeout=300)
    if made.returncode != 0:
        raise ProbeError(f"venv for {sha[:7]} failed: {made.stderr.strip()[:200]}")
    pip = root / ".venv" / "bin" / "pip"
    installed = run([pip, "install", "-q", "-e", ".[dev]"], cwd=root, timeout=1200)
    if installed.returncode != 0:
        raise ProbeError(f"pip install in {sha[:7]} failed: {installed.stderr.strip()[-300:]}")
    marker.write_text(sha + "\n")
    return Tree(f"old ({sha[:7]})", root)


def remove_old_tree(tree: Tree) -> None:
    """Drop a worktree ``old_tree`` made (for ``--no-keep``)."""
    run(["git", "worktree", "remove", "--force", str(tree.root)], cwd=HERE, timeout=120)
    shutil.rmtree(tree.root, ignore_errors=True)


def copy_of(tree: Tree, dest: Path) -> Path:
    """The sources of ``tree`` (no venv, no git) copied to ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree.root, dest, ignore=shutil.ignore_patterns(*_SKIPPED), symlinks=True)
    return dest
