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


def test_comparison_harness_prints_its_table() -> None:
    """benchmarks/compare.py --smoke: both servers measured in one run, a row per case (MLServer from PyPI)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--smoke"], capture_output=True,
                          text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| grpc") or line.startswith("| http")]
    assert [r[0].strip() for r in rows[:6]] == ["grpc simple c=1", "grpc simple c=4", "grpc simple c=16", "http simple c=4",
                                                "grpc identity_fp32 1 MiB c=4", "grpc identity_fp32 16 MiB c=4"]
    assert all(r[1].strip().endswith(("infer/s", "MB/s")) for r in rows[:6])  # ours never fails
    assert float(rows[1][3]) > 0  # both servers answered simple at c=4
    if (SHARED_MODELS / "all-MiniLM-L6-v2").is_dir():
        assert "ratio server / in-process" in done.stdout


def test_storm_harness_prints_its_table() -> None:
    """benchmarks/storm.py --smoke: every attack case gets a row, no probe fails, the server survives."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "storm.py"), "--smoke"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert len(rows) == 8 and all("errors 0" in row for row in rows), done.stdout
    assert "StatusCode.INVALID_ARGUMENT" in next(r for r in rows if "shrunk" in r)
    assert "server alive: True" in done.stdout
