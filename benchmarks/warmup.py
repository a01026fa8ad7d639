"""The first request after READY, with and without ``model_warmup`` (Triton's "Model Warmup").

One server per case serves the MiniLM ONNX graph (``../shared/models/all-MiniLM-L6-v2``, or
``--model DIR``: a Triton model folder whose inputs are INT64 ``[-1, -1]``) with one CPU instance:
once as it is, once with a warmup sample of zero data of the request's shape. As soon as the server
says it is ready, one gRPC client sends the same request (``[1, --tokens]`` of ones) ``1 + --after``
times, one at a time, and times each at the client. The table gives the first request's latency,
the median of the ``--after`` requests after it, and first / median: warmup's goal is a first
request no slower than the median (ONNX Runtime allocates and plans on its first run).

Usage: python benchmarks/warmup.py [--tokens 128] [--after 100] [--model DIR]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MINILM = ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _repository(folder: Path, model: Path, tokens: int, warmup: bool) -> None:
    """``folder/minilm``: the model's version 1 and a config with one CPU instance (and a warmup sample)."""
    target = folder / "minilm"
    shutil.copytree(model / "1", target / "1", ignore=shutil.ignore_patterns("*.json"))
    config = (model / "config.pbtxt").read_text().replace(f'name: "{model.name}"', 'name: "minilm"')
    config += "\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
    if warmup:
        samples = ", ".join(f'{{ key: "{name}" value: {{ data_type: TYPE_INT64 dims: [1, {tokens}] zero_data: true }} }}'
                           for name in INPUTS)
        config += f'model_warmup [{{ name: "zeros" batch_size: 1 inputs [ {samples} ] }}]\n'
    (target / "config.pbtxt").write_text(config)


def _latencies(repository: Path, tokens: int, after: int) -> list[float]:
    """Seconds per request, the first one sent as soon as the server is ready."""
    import tritonclient.grpc as grpcclient

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
                               "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--allow-http", "false",
                               "--allow-metrics", "false"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - the port is not open yet
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.01)
        inputs = []
        for name in INPUTS:
            tensor = grpcclient.InferInput(name, [1, tokens], "INT64")
            tensor.set_data_from_numpy(np.ones((1, tokens), np.int64))
            inputs.append(tensor)
        times = []
        for _ in range(1 + after):
            started = time.perf_counter()
            client.infer("minilm", inputs)
            times.append(time.perf_counter() - started)
        client.close()
        return times
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--after", type=int, default=100, help="requests after the first, for the median")
    parser.add_argument("--model", type=Path, default=MINILM, help="a Triton model folder (INT64 [-1, -1] inputs)")
    args = parser.parse_args()
    print("| case | first request, ms | median of the next, ms | first / median |")
    print("|---|---|---|---|")
    for warmup in (False, True):
        with tempfile.TemporaryDirectory() as folder:
            _repository(Path(folder), args.model, args.tokens, warmup)
            times = _latencies(Path(folder), args.tokens, args.after)
        first, median = times[0] * 1000, statistics.median(times[1:]) * 1000
        print(f"| {'with model_warmup' if warmup else 'without warmup'} | {first:.1f} | {median:.1f} | "
              f"{first / median:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
