"""/v1/embeddings on each device this host has: the same MiniLM files served as one model per device.

The MiniLM adapter is loaded once with ``KIND_CPU`` and, where CUDA is usable, once more with
``KIND_GPU``. One client sends the same requests to each: 1 sentence of about 20 words, 32 such
sentences, and 32 texts of 254 tokens. The table gives each case's p50 and p99 latency in ms and
the model's mean compute time per execution (ModelStatistics ``compute_infer``), and it reports
the lowest cosine between the devices' vectors. On a CPU host it prints the CPU rows alone.

The model comes as for encode.py (../shared/models, or examples/model_repository after `make models`).
Usage: python benchmarks/devices.py [--requests 15] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode import MODEL, model_folder, sentences  # noqa: E402 - the sibling benchmark's model and texts
from perf import start_server  # noqa: E402
from text_peers import min_cosine  # noqa: E402

from kserve_v2.runtime.device import cuda_device_count  # noqa: E402

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 28)  # 252 words, 254 tokens with [CLS] and [SEP]
CASES = {"1 sentence": sentences(1), "32 sentences": sentences(32), "32 x 254 tokens": [LONG] * 32}


def device_repository(source: Path, target: Path, kinds: list[str]) -> None:
    """``<MODEL>-<kind>`` for each kind: the source folder's config with that instance group, its files linked."""
    config = (source / "config.pbtxt").read_text()
    for kind in kinds:
        folder = target / f"{MODEL}-{kind}"
        (folder / "1").mkdir(parents=True)
        for file in (source / "1").iterdir():
            (folder / "1" / file.name).symlink_to(file.resolve())
        (folder / "config.pbtxt").write_text(config.replace(f'name: "{MODEL}"', f'name: "{MODEL}-{kind}"')
                                             .replace("KIND_AUTO", f"KIND_{kind.upper()}"))


def post(port: int, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.load(reply)


def embed(port: int, model: str, texts: list[str]) -> np.ndarray:
    data = post(port, "/v1/embeddings", {"model": model, "input": texts})["data"]
    return np.array([item["embedding"] for item in data], dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=15, help="timed requests per case and device")
    parser.add_argument("--smoke", action="store_true", help="two requests a case: checks the harness, not the speed")
    args = parser.parse_args()
    requests = 2 if args.smoke else args.requests
    kinds = ["cpu"] + (["gpu"] if cuda_device_count() else [])
    repository, scratch = model_folder()
    rows, probes = [], {}
    with tempfile.TemporaryDirectory() as work:
        device_repository(repository / MODEL, Path(work) / "repo", kinds)
        proc, ports = start_server(Path(work) / "repo", Path(work) / "server.log")
        try:
            for kind in kinds:
                model = f"{MODEL}-{kind}"
                probes[kind] = embed(ports["http"], model, sentences(8, seed=1))
                for case, texts in CASES.items():
                    embed(ports["http"], model, texts)  # warm-up (the first run of a shape)
                    times = []
                    for _ in range(requests):
                        began = time.perf_counter()
                        embed(ports["http"], model, texts)
                        times.append(time.perf_counter() - began)
                    p50, p99 = np.percentile(times, [50, 99]) * 1000
                    rows.append((kind, case, p50, p99))
                stats = post(ports["http"], f"/v2/models/{model}/stats")["model_stats"][0]["inference_stats"]
                compute = stats["compute_infer"]
                rows.append((kind, "compute_infer per execution", compute["ns"] / max(1, compute["count"]) / 1e6, None))
        finally:
            proc.terminate()
            proc.wait(60)
    if scratch is not None:
        scratch.cleanup()
    print(f"| device | case ({requests} requests, one client) | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    for kind, case, p50, p99 in rows:
        print(f"| {kind} | {case} | {p50:.1f} | {'-' if p99 is None else f'{p99:.1f}'} |")
    if "gpu" in probes:
        print(f"cosine cpu / gpu (min over 8 texts): {min_cosine(probes['cpu'], probes['gpu']):.6f}")
    else:
        print("no usable GPU: CPU rows only")


if __name__ == "__main__":
    main()
