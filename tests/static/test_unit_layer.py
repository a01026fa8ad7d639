"""The unit layer (tests/unit) as part of the whole suite.

It runs in its own pytest process: it imports the server's generated ``inference.*`` modules, which
cannot share a process with tritonclient's (tests/conftest.py leaves tests/unit out of this one).
"""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_unit_layer_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "tritonclient" not in done.stderr
