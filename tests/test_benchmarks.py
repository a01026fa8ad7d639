"""The benchmark harnesses run end to end (smoke mode: it checks they produce their table, not a speed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT, SHARED_MODELS


@pytest.mark.skipif(not (SHARED_MODELS / "all-MiniLM-L6-v2").is_dir(), reason="needs ../shared/models")
def test_encode_benchmark_prints_its_table() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "encode.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| case")}
    assert float(rows["POST /v1/encode, msgpack, one client"]) > 0
    assert float(rows["ratio server / in-process"]) > 0
