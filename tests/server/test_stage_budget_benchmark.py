"""benchmarks/stages.py runs end to end (smoke mode: it checks the harness produces its tables, not a speed):
the per-stage CPU budget of one request, for gRPC `simple`, gRPC `simple_python` and REST JSON `simple`."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

CASES = ["gRPC ModelInfer, `simple`", "gRPC ModelInfer, `simple_python`", "REST JSON"]
STAGES = ["1.", "2.", "3.", "4.", "5.", "6a", "6b", "7."]


def test_stage_budget_prints_a_positive_figure_for_every_stage() -> None:
    """Each case's table has stages 1-7, their sum, the unattributed rest and the whole handler, every stage and
    the whole with a positive figure; the REST table also has the do-nothing ASGI app's figure."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stages.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    tables = done.stdout.split("### ")[1:]
    assert [next((c for c in CASES if t.startswith(c)), t) for t in tables] == CASES, done.stdout
    for text in tables:
        rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                                  for line in text.splitlines() if line.startswith("| "))}
        stages = [label for label in rows if label[:2] in STAGES]
        assert [label[:2] for label in stages] == STAGES, text
        wholes = [label for label in rows if label.startswith("whole")]
        assert len(wholes) == 1 and "sum of 1-7" in rows and "unattributed (whole - sum)" in rows, text
        for label in stages + wholes:
            assert float(rows[label][0]) > 0, (label, rows[label])
        ceilings = [label for label in rows if "do-nothing" in label and label[:2] not in STAGES]
        assert len(ceilings) == (1 if text.startswith("REST") else 0), text
        for label in ceilings:
            assert float(rows[label][0]) > 0, (label, rows[label])
