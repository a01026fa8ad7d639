"""fastembed in process on a MiniLM folder: the "no server at all" ceiling of benchmarks/text_peers.py.

Runs in fastembed's own environment (the user's cache folder; text_peers.py installs it), so it
imports nothing of this project. Reads a JSON job on stdin: {"folder", "threads", "seconds",
"cases": [{"label", "texts": [[...batch...], ...]}], "probe": [texts]}; writes one JSON line:
{"cases": {label: {"texts/s", "p50 ms", "p99 ms"}}, "probe": [[vector], ...]}.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType

NAME = "kserve-v2-bench/all-MiniLM-L6-v2"


def main() -> None:
    job = json.load(sys.stdin)
    TextEmbedding.add_custom_model(model=NAME, pooling=PoolingType.MEAN, normalization=True,
                                   sources=ModelSource(hf=NAME), dim=384, model_file="model.onnx")
    model = TextEmbedding(model_name=NAME, specific_model_path=job["folder"], threads=job["threads"])
    results = {}
    for case in job["cases"]:
        batches = case["texts"]
        list(model.embed(batches[0], batch_size=len(batches[0])))  # warm-up
        latencies, done = [], 0
        deadline = time.perf_counter() + job["seconds"]
        started = time.perf_counter()
        while time.perf_counter() < deadline or not latencies:
            batch = batches[len(latencies) % len(batches)]
            began = time.perf_counter()
            list(model.embed(batch, batch_size=len(batch)))
            latencies.append(time.perf_counter() - began)
            done += len(batch)
        elapsed = time.perf_counter() - started
        p50, p99 = np.percentile(latencies, [50, 99]) * 1000
        results[case["label"]] = {"texts/s": done / elapsed, "p50 ms": float(p50), "p99 ms": float(p99)}
    probe = [vector.tolist() for vector in model.embed(job["probe"], batch_size=len(job["probe"]))]
    print(json.dumps({"cases": results, "probe": probe}))


if __name__ == "__main__":
    main()
