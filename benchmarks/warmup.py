"""The first request after READY, with and without ``model_warmup`` (Triton's "Model Warmup").

One server per run serves the MiniLM ONNX graph (``../shared/models/all-MiniLM-L6-v2``, or
``--model DIR``: a Triton model folder whose inputs are INT64 ``[-1, -1]``) with one CPU instance:
as it is, or with a warmup sample of zero data of the request's shape. As soon as the server says
it is ready, one gRPC client sends one request to a second, trivial model (so that what the client
and the server's request path do once, on their first request, is not counted), then the same
request to MiniLM (``[1, --tokens]`` of ones) ``1 + --after`` times, one at a time, each after
``--gap`` seconds of idle, timed at the client. ONNX Runtime's threads stop spinning when idle, and
a request after a pause pays their wake-up whether or not it is the first; ``--gap 0`` sends the
requests back to back, so that the first alone pays it.

The table gives, per case, the median over ``--repeats`` server starts of the first request's
latency, the median of all the requests after it, and first / median: warmup's goal is a first
request no slower than the median.

Usage: python benchmarks/warmup.py [--tokens 128] [--after 20] [--gap 0.2] [--repeats 5] [--model DIR]
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
from onnx import TensorProto, helper

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
    trivial = folder / "trivial" / "1"
    trivial.mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "trivial",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.INT64, [None, None])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT64, [None, None])])
    model_proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model_proto.ir_version = 10
    (trivial / "model.onnx").write_bytes(model_proto.SerializeToString())


def _latencies(repository: Path, tokens: int, after: int, gap: float) -> list[float]:
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
        first = grpcclient.InferInput("INPUT0", [1, tokens], "INT64")
        first.set_data_from_numpy(np.ones((1, tokens), np.int64))
        client.infer("trivial", [first])  # the client's and the request path's first request
        times = []
        for _ in range(1 + after):
            time.sleep(gap)
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
    parser.add_argument("--after", type=int, default=20, help="requests after the first, for the median")
    parser.add_argument("--repeats", type=int, default=5, help="server starts per case (the first request's median)")
    parser.add_argument("--gap", type=float, default=0.2, help="seconds of idle before each request")
    parser.add_argument("--model", type=Path, default=MINILM, help="a Triton model folder (INT64 [-1, -1] inputs)")
    args = parser.parse_args()
    print("| case | first request, ms | median of the next, ms | first / median |")
    print("|---|---|---|---|")
    for warmup in (False, True):
        firsts, rest = [], []
        with tempfile.TemporaryDirectory() as folder:
            _repository(Path(folder), args.model, args.tokens, warmup)
            for _ in range(args.repeats):  # a fresh server each time: one first request per start
                times = _latencies(Path(folder), args.tokens, args.after, args.gap)
                firsts.append(times[0])
                rest += times[1:]
        first, median = statistics.median(firsts) * 1000, statistics.median(rest) * 1000
        print(f"| {'with model_warmup' if warmup else 'without warmup'} | {first:.1f} | {median:.1f} | "
              f"{first / median:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
