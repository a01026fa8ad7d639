"""benchmarks/text_peers.py runs end to end (smoke mode: it checks the harness produces its table, not a speed),
with ours on ONNX Runtime's CPU provider and on OpenVINO (``--openvino``, which stops unless both models loaded there).

The peers' environments (infinity-emb with torch, fastembed) are not installed here: their columns
are measured only when `make bench` has already put them in the cache (--peers-if-cached), else they show "-".
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT, SHARED_MODELS


@pytest.mark.skipif(not (SHARED_MODELS / "all-MiniLM-L6-v2").is_dir(),
                    reason="benchmarks/text_peers.py measures fp32 MiniLM: ONNX in ../shared/models, on PyPI safetensors only")
@pytest.mark.parametrize("openvino", [(), ("--openvino",)], ids=["cpu", "openvino"])
def test_text_peers_harness_prints_its_table(openvino: tuple[str, ...]) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "text_peers.py"), "--smoke", "--peers-if-cached",
                           *openvino], capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in done.stdout.splitlines()
                                              if line.startswith(("| embeddings", "| rerank")))}
    assert list(rows) == ["embeddings 1 x short", "embeddings 32 x short", "embeddings 1 x 256 tokens",
                          "embeddings 32 x 256 tokens", "rerank 32 x short", "rerank 32 x 256 tokens"]
    for label, (ours, infinity, fastembed, *_) in rows.items():
        assert float(ours.split(" (")[0].replace(",", "")) > 0, (label, ours)  # ours answered every case
        for peer in (infinity, fastembed):
            assert peer == "-" or float(peer.split(" (")[0].replace(",", "")) > 0, (label, peer)
    assert "Targets:" in done.stdout
    for line in done.stdout.splitlines():
        if line.startswith("cosine"):
            assert float(line.rsplit(" ", 1)[1]) > 0.999, line
