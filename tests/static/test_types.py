"""Static types: ``mypy --strict`` finds nothing in kserve_v2, transcoding and adapters ([tool.mypy] in
pyproject.toml; the generated protobuf modules are read through their --pyi_out stubs, not checked).

mypy reads the source statically; nothing of the server is imported here.
"""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_mypy_strict_finds_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
