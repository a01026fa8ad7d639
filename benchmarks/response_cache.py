"""Server CPU per request of a response-cache hit against a miss (Triton's ``--cache-config local,size=...``).

One server, started with ``--cache-config local,size=<64 MiB>``, serves two ONNX models with
``response_cache { enable: true }``, each taking and giving a 1 MiB FP32 tensor ([512, 512]):
``identity`` (the model costs nothing: the floor, what the transport, decoding, hashing and encoding
cost, which a hit cannot skip) and ``mlp`` (``--depth`` MatMuls by a [512, 512] weight, 16 by default:
a model that computes, about 4 GFLOP a request). For each model, four
gRPC clients (concurrency 4) send, for ``--seconds`` after a warm-up:

- hit: the same request over and over (every one after the first answered from the cache);
- miss: a request whose first element changes every time (every one runs the model and is stored,
  the oldest entries evicted once the cache is full).

The server's CPU time (``/proc/<pid>/stat`` user + system: every thread; the model runs in the
server's process) is read before and after, divided by the requests answered. The table gives ms
of server CPU per request, hit and miss, and hit / miss (the goal: under 0.3 for a model that
computes; the identity row shows the part a hit cannot skip). Rounds alternate hit and miss; the
table shows the median of the rounds.

Usage: python benchmarks/response_cache.py [--seconds 5] [--rounds 3] [--depth 16] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

TICKS = os.sysconf("SC_CLK_TCK")
SIZE = 512  # [512, 512] FP32: 1 MiB
CACHE_BYTES = 64 << 20
CONCURRENCY = 4
CONFIG = """max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 512, 512 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 512, 512 ] }]
response_cache { enable: true }
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _model(depth: int) -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0: identity (``depth`` 0), or INPUT0 @ W @ W ... (``depth`` times) with a constant
    [512, 512] W of 1/512."""
    if depth:
        weight = helper.make_tensor("W", TensorProto.FLOAT, [SIZE, SIZE], [1.0 / SIZE] * (SIZE * SIZE))
        names = ["INPUT0"] + [f"h{i}" for i in range(1, depth)] + ["OUTPUT0"]
        nodes = [helper.make_node("MatMul", [names[i], "W"], [names[i + 1]]) for i in range(depth)]
        initializer = [weight]
    else:
        nodes, initializer = [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], []
    graph = helper.make_graph(nodes, "cached", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [SIZE, SIZE])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [SIZE, SIZE])],
                              initializer=initializer)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _repository(root: Path, depth: int) -> Path:
    repository = root / "repo"
    for name, layers in (("identity", 0), ("mlp", depth)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.onnx").write_bytes(_model(layers).SerializeToString())
        (repository / name / "config.pbtxt").write_text(CONFIG)
    return repository


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _load(url: str, model: str, hit: bool, seconds: float) -> tuple[int, float]:
    """Requests answered by CONCURRENCY clients in ``seconds``, and the server CPU seconds they took."""
    import tritonclient.grpc as grpcclient

    stop = threading.Event()
    counts = [0] * CONCURRENCY
    errors: list[BaseException] = []

    def client(index: int) -> None:
        data = np.ones((SIZE, SIZE), dtype=np.float32)
        bits = data.view(np.int32)  # the first two elements' bits: (client, request), never repeated
        with grpcclient.InferenceServerClient(url) as triton:
            sent = 0
            while not stop.is_set():
                if not hit:  # every request differs: a miss
                    bits[0, 0], bits[0, 1] = index, sent
                tensor = grpcclient.InferInput("INPUT0", [SIZE, SIZE], "FP32")
                tensor.set_data_from_numpy(data)
                try:
                    triton.infer(model, [tensor])
                except BaseException as err:  # noqa: BLE001 - reported by the caller
                    errors.append(err)
                    return
                sent += 1
                counts[index] = sent

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    time.sleep(min(1.0, seconds))  # warm-up (the hit case's first request is its one miss)
    before, answered = _cpu_seconds(SERVER_PID[0]), sum(counts)
    time.sleep(seconds)
    after, done = _cpu_seconds(SERVER_PID[0]), sum(counts)
    stop.set()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{model}: {errors[0]}")
    return done - answered, after - before


SERVER_PID = [0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depth", type=int, default=16, help="MatMuls of the mlp model")
    parser.add_argument("--smoke", action="store_true", help="one short round: checks the harness, not a speed")
    args = parser.parse_args()
    seconds, rounds = (1.0, 1) if args.smoke else (args.seconds, args.rounds)
    with tempfile.TemporaryDirectory() as work:
        repository = _repository(Path(work), args.depth)
        port = _free_port()
        log = Path(work) / "server.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
                                     "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--allow-http", "false",
                                     "--allow-metrics", "false", "--cache-config", f"local,size={CACHE_BYTES}"],
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        SERVER_PID[0] = proc.pid
        try:
            _wait_ready(f"127.0.0.1:{port}", proc, log)
            rows = []
            for model in ("identity", "mlp"):
                per_request: dict[str, list[float]] = {"hit": [], "miss": []}
                for _ in range(rounds):
                    for case in ("hit", "miss"):
                        requests, cpu = _load(f"127.0.0.1:{port}", model, case == "hit", seconds)
                        per_request[case].append(cpu / max(requests, 1) * 1e3)
                hit, miss = statistics.median(per_request["hit"]), statistics.median(per_request["miss"])
                rows.append((model, hit, miss, per_request))
            counted = _cache_counts(f"127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"| model (1 MiB FP32 in and out, gRPC c={CONCURRENCY}) | hit, ms CPU / request | miss, ms CPU / request "
          "| hit / miss |")
    print("|---|---|---|---|")
    for model, hit, miss, per_request in rows:
        rounds_text = ", ".join(f"{h:.2f}/{m:.2f}" for h, m in zip(per_request["hit"], per_request["miss"], strict=True))
        print(f"| {model} | {hit:.2f} | {miss:.2f} | {hit / miss:.2f} (rounds hit/miss: {rounds_text}) |")
    print("the server's own counts (ModelStatistics cache_hit / cache_miss): "
          + ", ".join(f"{model} {hits} / {misses}" for model, (hits, misses) in counted.items()))


def _cache_counts(url: str) -> dict[str, tuple[int, int]]:
    """Each model's ModelStatistics cache_hit and cache_miss counts."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        rows = client.get_inference_statistics(as_json=True)["model_stats"]
    return {row["name"]: (int(row["inference_stats"]["cache_hit"].get("count", 0)),
                          int(row["inference_stats"]["cache_miss"].get("count", 0))) for row in rows}


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        try:
            with grpcclient.InferenceServerClient(url) as client:
                if client.is_server_ready():
                    return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready in 120 s:\n{log.read_text()}")


if __name__ == "__main__":
    main()
