"""Side by side, in one run: this server against MLServer 1.7 serving the same ONNX models.

MLServer (PyPI) runs in its own virtual environment (``mlserver-1.7`` in the user's cache folder,
see benchmarks/cache.py; created on first use) with the small custom runtime in
benchmarks/mlserver_runtime.py. perf_analyzer cannot drive MLServer (it asks for the ModelConfig RPC, which MLServer lacks: "failed to get model config:
Method not found!"), so one closed-loop tritonclient asyncio load generator drives both servers
with the same requests: `simple` over gRPC at concurrency 1, 4 and 16 and over REST at 4; the FP32
identity model with 1 MiB and 16 MiB tensors over gRPC at 4. Then benchmarks/encode.py gives
/v1/encode next to in-process ORT. Prints a table with ours / MLServer ratios.

Usage: python benchmarks/compare.py [--seconds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache import cache_dir  # noqa: E402 - sibling module
from perf import ROOT, start_server  # noqa: E402 - the sibling benchmark's server launcher

HERE = Path(__file__).resolve().parent
# uvloop 0.22 broke MLServer 1.7's workers ("There is no current event loop")
MLSERVER = ["mlserver==1.7.1", "uvloop<0.22", "onnxruntime", "numpy"]
EXAMPLES = ROOT / "examples" / "model_repository"
MIB = 2**20
MINILM = "all-MiniLM-L6-v2"


def mlserver_env() -> Path:
    """The MLServer executable, installing it into its own environment the first time."""
    env = cache_dir("mlserver-1.7")
    executable = env / "bin" / "mlserver"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", *MLSERVER], check=True)
    return executable


def start_mlserver(folder: Path, log: Path) -> tuple[subprocess.Popen, dict[str, int]]:
    ports = {"http": _free_port(), "grpc": _free_port()}
    for model in ("simple", "identity_fp32"):
        (folder / model).mkdir(parents=True)
        shutil.copy(HERE / "mlserver_runtime.py", folder / model)
        settings = {"name": model, "implementation": "mlserver_runtime.OnnxModel",
                    "parameters": {"uri": str(EXAMPLES / model / "1" / "model.onnx")}}
        (folder / model / "model-settings.json").write_text(json.dumps(settings))
    (folder / "settings.json").write_text(json.dumps({"host": "127.0.0.1", "http_port": ports["http"],
                                                      "grpc_port": ports["grpc"], "metrics_port": _free_port()}))
    proc = subprocess.Popen([str(mlserver_env()), "start", str(folder)], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/v2/models/identity_fp32/ready", timeout=1):
                return proc, ports
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"MLServer did not become ready:\n{log.read_text()[-3000:]}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _inputs(module, model: str, elements: int) -> list:
    if model == "simple":
        arrays = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), np.int32)}
    else:
        arrays = {"INPUT0": np.ones((1, elements), np.float32)}
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "INT32" if array.dtype == np.int32 else "FP32")
        if module is httpaio:
            tensor.set_data_from_numpy(array, binary_data=False)  # JSON: MLServer has no binary tensor extension
        else:
            tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


async def drive(protocol: str, port: int, model: str, elements: int, concurrency: int, seconds: float) -> str | float:
    """Closed loop: ``concurrency`` callers for ``seconds``; infer/s, or the first error's text."""
    module = grpcaio if protocol == "grpc" else httpaio
    url = f"127.0.0.1:{port}"
    client = module.InferenceServerClient(url) if protocol == "http" else module.InferenceServerClient(
        url, channel_args=[("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)])
    inputs = _inputs(module, model, elements)
    names = ["OUTPUT0", "OUTPUT1"] if model == "simple" else ["OUTPUT0"]
    outputs = [httpaio.InferRequestedOutput(n, binary_data=False) for n in names] if protocol == "http" else None
    # tritonclient sends no Content-Type; MLServer's FastAPI then refuses the body (422)
    headers = {"Content-Type": "application/json"} if protocol == "http" else None
    done, errors = 0, []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < deadline and not errors:
            try:
                await client.infer(model, inputs, outputs=outputs, headers=headers)
                done += 1
            except Exception as err:  # noqa: BLE001 - reported in the table
                errors.append(str(err).splitlines()[0][:60])

    try:
        await client.infer(model, inputs, outputs=outputs, headers=headers)  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*[caller() for _ in range(concurrency)])
        elapsed = time.perf_counter() - started
    except Exception as err:  # noqa: BLE001
        errors.append(str(err).splitlines()[0][:60])
    finally:
        await client.close()
    return f"fails: {errors[0]}" if errors else done / elapsed


def _figure(value: str | float, elements: int) -> str:
    if not isinstance(value, float):
        return value
    return f"{value * elements * 4 / 1e6:.0f} MB/s" if elements else f"{value:.0f} infer/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--smoke", action="store_true", help="short windows: checks the harness, not the speed")
    args = parser.parse_args()
    seconds = 0.5 if args.smoke else args.seconds
    cases = [("grpc simple c=1", "grpc", "simple", 0, 1), ("grpc simple c=4", "grpc", "simple", 0, 4),
             ("grpc simple c=16", "grpc", "simple", 0, 16), ("http simple c=4", "http", "simple", 0, 4),
             ("grpc identity_fp32 1 MiB c=4", "grpc", "identity_fp32", MIB // 4, 4),
             ("grpc identity_fp32 16 MiB c=4", "grpc", "identity_fp32", 16 * MIB // 4, 4)]
    results: dict[str, dict[str, str | float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for server in ("ours", "MLServer"):
            if server == "ours":
                proc, ports = start_server(EXAMPLES, work / "ours.log", "--model-control-mode", "explicit",
                                           "--load-model", "simple", "--load-model", "identity_fp32")
            else:
                proc, ports = start_mlserver(work / "mlserver", work / "mlserver.log")
            try:
                for label, protocol, model, elements, concurrency in cases:
                    results.setdefault(label, {})[server] = asyncio.run(
                        drive(protocol, ports[protocol], model, elements, concurrency, seconds))
            finally:
                proc.terminate()
                proc.wait(60)
    print("| case | ours | MLServer 1.7 | ours / MLServer |")
    print("|---|---|---|---|")
    for label, _, _, elements, _ in cases:
        ours, theirs = results[label]["ours"], results[label]["MLServer"]
        ratio = f"{ours / theirs:.2f}" if isinstance(ours, float) and isinstance(theirs, float) else "n/a"
        print(f"| {label} | {_figure(ours, elements)} | {_figure(theirs, elements)} | {ratio} |")
    if not ((ROOT.parent / "shared" / "models" / MINILM).is_dir() or (EXAMPLES / MINILM / "1" / "tokenizer.json").is_file()):
        print(f"/v1/encode: skipped, no {MINILM} (keep ../shared beside the project or run `make models`)")
        return
    encode = [sys.executable, str(HERE / "encode.py")] + (["--smoke"] if args.smoke else [])
    subprocess.run(encode, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


if __name__ == "__main__":
    main()
