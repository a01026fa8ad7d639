"""The committed tree holds nothing machine-local: it must work the same from any fresh clone.

Fails on a committed symbolic link that is absolute or leaves the tree, a committed file naming an
absolute path of this machine (the checkout, the home folder, the interpreter's prefix), and a
committed virtual environment, bytecode or tool cache.
"""

from __future__ import annotations

import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# path parts that only a run creates: environments, bytecode, tool caches
CREATED_BY_RUNS = {".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                   "node_modules", "site-packages", ".tox", ".cache"}
CREATED_SUFFIXES = (".pyc", ".pyo")
CREATED_NAMES = {"pyvenv.cfg"}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.fail(f"the tree must be a git checkout with git on PATH: {err}")


def _entries() -> list[tuple[str, str]]:
    """(mode, path) of every file in the index."""
    rows = []
    for line in _git("ls-files", "-s", "-z").split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            rows.append((meta.split()[0], path))
    return rows


def test_no_symlink_leaves_the_tree() -> None:
    bad = []
    for mode, path in _entries():
        if mode != "120000":
            continue
        target = _git("cat-file", "-p", f":{path}")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if posixpath.isabs(target) or resolved == ".." or resolved.startswith("../"):
            bad.append(f"{path} -> {target}")
    assert not bad, f"committed symbolic links that point outside the tree: {bad}"


def test_no_environment_or_cache_is_committed() -> None:
    bad = [path for _, path in _entries()
           if CREATED_BY_RUNS & set(Path(path).parts[:-1]) or path.endswith(CREATED_SUFFIXES)
           or Path(path).name in CREATED_NAMES]
    assert not bad, f"committed environments, bytecode or caches: {bad[:10]}"


def test_no_file_names_a_path_of_this_machine() -> None:
    local = {str(ROOT), str(ROOT.parent), sys.prefix, sys.base_prefix}
    home = str(Path.home())
    if home not in ("/", "/root"):  # /root is also a common absolute path in container docs
        local.add(home)
    needles = [p.encode() for p in local if p.count("/") >= 2]  # skip "/" and one-level roots such as /usr
    bad = []
    for mode, path in _entries():
        if mode == "120000":
            continue
        data = (ROOT / path).read_bytes()
        bad += [f"{path}: {needle.decode()}" for needle in needles if needle in data]
    assert not bad, f"committed files name absolute paths of this machine: {bad}"
