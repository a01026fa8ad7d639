"""The code stays free of what ruff's pyflakes, syntax-error, bugbear and pyupgrade rules find (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_ruff_finds_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "kserve_v2", "transcoding", "adapters", "tests", "examples",
                           "benchmarks", "deploy"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
