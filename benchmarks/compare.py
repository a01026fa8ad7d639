"""Side by side, in one run: this server, Triton 2.51, MLServer 1.7 and the ceiling of our own stack.

Servers, all started at once on the same box with the same ONNX files, then measured case by case,
one after another (so the figures of a row are taken within the same minute on a noisy box):
- ours (the example repository);
- Triton 2.51 from PyPI's nvidia-pytriton 0.7.0 wheel, serving the models through the python
  backend with ONNX Runtime (benchmarks/triton.py; own environment in the user's cache folder);
- MLServer 1.7 with a small ONNX Runtime runtime (benchmarks/mlserver_runtime.py; own environment);
- the ceiling: a bare grpc.aio + uvloop servicer (benchmarks/ceiling_grpc.py) and a bare uvicorn +
  httptools + uvloop ASGI app (benchmarks/ceiling_rest.py) that parse the request and answer a
  prepared response.

Load generators: Triton's perf_analyzer drives ours, Triton and the ceiling; MLServer has no
ModelConfig RPC ("failed to get model config: Method not found!"), so one closed-loop tritonclient
asyncio generator drives ours and MLServer. Each ratio compares figures of one generator.
Cases: `simple` over gRPC at concurrency 1, 4, 16; over REST with JSON at 4; the FP32 identity model
at 1 MiB (concurrency 4) and 16 MiB (concurrency 1) over gRPC and over REST with binary tensors; and
the python step: `simple_python` (examples/model_repository/simple_python/1/model.py, `simple`'s sum and
difference in numpy) run by our python backend and by Triton's, the same file, over gRPC at concurrency
1 and 4 (perf_analyzer only: neither the ceiling nor MLServer runs python models), in our server's
process and in our stub processes (``EXECUTION_MODE`` ``process``, as Triton runs it).
Then our cold start to ready and idle RSS next to Triton's, and benchmarks/encode.py.

Usage: python benchmarks/compare.py [--seconds 5] [--smoke] [--skip-triton] [--skip-mlserver] [--case TEXT ...]
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton  # noqa: E402 - sibling module
from cache import cache_dir  # noqa: E402 - sibling module
from perf import ROOT, perf_analyzer, run, start_server, tensor_window  # noqa: E402 - the sibling benchmark's helpers

from kserve_v2.host.allocator import huge_page_environment, this_host  # noqa: E402
from processes import wait_http  # noqa: E402 - sibling module

HERE = Path(__file__).resolve().parent
# uvloop 0.22 broke MLServer 1.7's workers ("There is no current event loop")
MLSERVER = ["mlserver==1.7.1", "uvloop<0.22", "onnxruntime", "numpy"]
EXAMPLES = ROOT / "examples" / "model_repository"
MIB = 2**20
MINILM = "all-MiniLM-L6-v2"
SERVERS = ("ours", "Triton", "ceiling", "MLServer")
PROCESS_MODEL = "simple_python_process"  # simple_python with EXECUTION_MODE process, made by _ours


@dataclass(frozen=True)
class Case:
    label: str
    protocol: str  # grpc | http
    model: str
    elements: int  # FP32 elements of the identity tensor; 0 for simple
    concurrency: int
    tensor_format: str | None = None  # http: json | binary
    servers: tuple[str, ...] = SERVERS  # the servers that run the case
    ours_model: str = ""  # the model our server runs for the case, when not ``model``


CASES = (
    Case("grpc simple c=1", "grpc", "simple", 0, 1),
    Case("grpc simple c=4", "grpc", "simple", 0, 4),
    Case("grpc simple c=16", "grpc", "simple", 0, 16),
    Case("http simple json c=4", "http", "simple", 0, 4, "json"),
    Case("grpc identity 1 MiB c=4", "grpc", "identity_fp32", MIB // 4, 4),
    Case("grpc identity 16 MiB c=1", "grpc", "identity_fp32", 16 * MIB // 4, 1),
    Case("http identity binary 1 MiB c=4", "http", "identity_fp32", MIB // 4, 4, "binary"),
    Case("http identity binary 16 MiB c=1", "http", "identity_fp32", 16 * MIB // 4, 1, "binary"),
    # the python step: the same model.py on our python backend and on Triton's
    Case("grpc simple_python c=1", "grpc", "simple_python", 0, 1, servers=("ours", "Triton")),
    Case("grpc simple_python c=4", "grpc", "simple_python", 0, 4, servers=("ours", "Triton")),
    # the same file in our stub processes (EXECUTION_MODE process), as Triton runs it
    Case("grpc simple_python in a stub process c=1", "grpc", "simple_python", 0, 1, servers=("ours", "Triton"),
         ours_model=PROCESS_MODEL),
    Case("grpc simple_python in a stub process c=4", "grpc", "simple_python", 0, 4, servers=("ours", "Triton"),
         ours_model=PROCESS_MODEL),
)


def mlserver_env() -> Path:
    """The MLServer executable, installing it into its own environment the first time."""
    env = cache_dir("mlserver-1.7")
    executable = env / "bin" / "mlserver"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", *MLSERVER], check=True)
    return executable


def start_mlserver(folder: Path, log: Path) -> tuple[list[subprocess.Popen], dict[str, int]]:
    ports = {"http": _free_port(), "grpc": _free_port()}
    for model in ("simple", "identity_fp32"):
        (folder / model).mkdir(parents=True)
        shutil.copy(HERE / "mlserver_runtime.py", folder / model)
        settings = {"name": model, "implementation": "mlserver_runtime.OnnxModel",
                    "parameters": {"uri": str(EXAMPLES / model / "1" / "model.onnx")}}
        (folder / model / "model-settings.json").write_text(json.dumps(settings))
    (folder / "settings.json").write_text(json.dumps({"host": "127.0.0.1", "http_port": ports["http"],
                                                      "grpc_port": ports["grpc"], "metrics_port": _free_port(),
                                                      "grpc_max_message_length": 2**31 - 1}))
    # cwd: MLServer writes its Prometheus multiprocess files into ./.metrics of its working folder
    proc = subprocess.Popen([str(mlserver_env()), "start", str(folder)], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            cwd=folder)
    wait_http(proc, f"http://127.0.0.1:{ports['http']}/v2/models/identity_fp32/ready", log, "MLServer")
    return [proc], ports


def start_ceiling(work: Path, workers: int = 1) -> tuple[list[subprocess.Popen], dict[str, int]]:
    """Both ceiling servers (gRPC and REST), each its own process (``workers`` processes on its port)."""
    ports = {"grpc": _free_port(), "http": _free_port()}
    # the allocator setting `kserve-v2` starts itself with (kserve_v2/host/allocator.py), so the stack compares alike
    env = {**(huge_page_environment(os.environ, *this_host()) or os.environ),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    procs = []
    for protocol in ("grpc", "http"):
        script = HERE / ("ceiling_grpc.py" if protocol == "grpc" else "ceiling_rest.py")
        log = work / f"ceiling-{protocol}-{workers}.log"
        procs.append(subprocess.Popen([sys.executable, str(script), "--port", str(ports[protocol]), "--repository",
                                       str(EXAMPLES), "--workers", str(workers)], stdout=open(log, "w"),
                                      stderr=subprocess.STDOUT, env=env))
    wait_http(procs[1], f"http://127.0.0.1:{ports['http']}/v2/health/ready", work / f"ceiling-http-{workers}.log",
              "ceiling REST")
    for _ in range(600):  # the gRPC ceiling prints its line once its port is open (each of its processes)
        if (work / f"ceiling-grpc-{workers}.log").read_text().count("listening") >= workers:
            return procs, ports
        time.sleep(0.1)
    sys.exit(f"ceiling gRPC did not start:\n{(work / f'ceiling-grpc-{workers}.log').read_text()[-3000:]}")


def start_triton(env: Path, work: Path) -> tuple[list[subprocess.Popen], dict[str, int]]:
    ports = {"grpc": _free_port(), "http": _free_port(), "metrics": _free_port()}
    return [triton.start(env, EXAMPLES, work, ports, work / "triton.log")], ports


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _inputs(module, model: str, elements: int, binary: bool) -> list:
    if model == "simple":
        arrays = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), np.int32)}
    else:
        arrays = {"INPUT0": np.ones((1, elements), np.float32)}
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "INT32" if array.dtype == np.int32 else "FP32")
        if module is httpaio:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


async def drive(case: Case, port: int, seconds: float) -> dict[str, float] | str:
    """Closed loop: ``concurrency`` callers for ``seconds``; infer/s and p50/p99 ms, or the first error's text."""
    http = case.protocol == "http"
    module = httpaio if http else grpcaio
    url = f"127.0.0.1:{port}"
    client = module.InferenceServerClient(url) if http else module.InferenceServerClient(
        url, channel_args=[("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)])
    binary = case.tensor_format == "binary"
    inputs = _inputs(module, case.model, case.elements, binary)
    names = ["OUTPUT0", "OUTPUT1"] if case.model == "simple" else ["OUTPUT0"]
    outputs = [httpaio.InferRequestedOutput(n, binary_data=binary) for n in names] if http else None
    # tritonclient sends no Content-Type; MLServer's FastAPI then refuses the body (422)
    headers = {"Content-Type": "application/json"} if http and not binary else None
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < deadline and not errors:
            began = time.perf_counter()
            try:
                await client.infer(case.model, inputs, outputs=outputs, headers=headers)
                latencies.append(time.perf_counter() - began)
            except Exception as err:  # noqa: BLE001 - reported in the table
                errors.append(str(err).splitlines()[0][:60])

    try:
        await client.infer(case.model, inputs, outputs=outputs, headers=headers)  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*[caller() for _ in range(case.concurrency)])
        elapsed = time.perf_counter() - started
    except Exception as err:  # noqa: BLE001
        errors.append(str(err).splitlines()[0][:60])
    finally:
        await client.close()
    if errors or not latencies:
        return f"fails: {errors[0] if errors else 'no request finished'}"
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return {"infer/s": len(latencies) / elapsed, "p50 ms": float(p50), "p99 ms": float(p99)}


def measure_pa(tool: str, case: Case, ports: dict[str, int], seconds: float, work: Path,
               model: str = "") -> dict[str, float] | str:
    """perf_analyzer's figures over three windows; no stability criterion (on a shared box it is rarely met)."""
    shape = f"INPUT0:{case.elements}" if case.elements else None
    try:
        return run(tool, ports, model or case.model, case.concurrency, seconds, shape, work, case.protocol, case.tensor_format,
                   stability=999, window_requests=tensor_window(case.elements * 4, seconds))
    except subprocess.CalledProcessError as err:
        return f"fails: perf_analyzer exit {err.returncode}"


def cold_start(work: Path) -> dict[str, float]:
    """Seconds from exec to ready on the example repository, and RSS (MiB) one second after."""
    began = time.perf_counter()
    proc, _ = start_server(EXAMPLES, work / "cold.log")
    ready = time.perf_counter() - began
    time.sleep(1)
    rss = _rss_mib(proc.pid)
    proc.terminate()
    proc.wait(60)
    return {"ready s": ready, "idle RSS MiB": rss}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cell(value: dict[str, float] | str | None, case: Case) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    rate = value["infer/s"]
    figure = f"{rate * case.elements * 4 / 1e6:,.0f} MB/s" if case.elements else f"{rate:,.0f} infer/s"
    return f"{figure} ({value['p50 ms']:.2f} / {value['p99 ms']:.2f})"


def ratio(ours: dict[str, float] | str | None, theirs: dict[str, float] | str | None) -> str:
    """ours' infer/s over theirs', two decimals; "n/a" when either side has no figure."""
    if isinstance(ours, dict) and isinstance(theirs, dict) and theirs["infer/s"]:
        return f"{ours['infer/s'] / theirs['infer/s']:.2f}"
    return "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5, help="measurement window")
    parser.add_argument("--smoke", action="store_true", help="short windows: checks the harness, not the speed")
    parser.add_argument("--skip-triton", action="store_true", help="leave Triton out")
    parser.add_argument("--skip-mlserver", action="store_true", help="leave MLServer out")
    parser.add_argument("--triton-if-cached", action="store_true",
                        help="run Triton only when its environment is already in the cache (no download)")
    parser.add_argument("--case", action="append", default=[],
                        help="run only the cases whose label contains this text (repeatable)")
    args = parser.parse_args()
    cases = [case for case in CASES if not args.case or any(text in case.label for text in args.case)]
    seconds = 0.5 if args.smoke else args.seconds
    tool = perf_analyzer()
    triton_env = None if args.skip_triton else triton.environment(create=not args.triton_if_cached)
    pa: dict[tuple[str, str], dict[str, float] | str] = {}  # (server, case) -> perf_analyzer figures
    tc: dict[tuple[str, str], dict[str, float] | str] = {}  # (server, case) -> tritonclient generator figures
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        starts = {"ours": lambda: _ours(work), "ceiling": lambda: start_ceiling(work)}
        if triton_env is not None:
            starts["Triton"] = lambda: start_triton(triton_env, work)
        if not args.skip_mlserver:
            starts["MLServer"] = lambda: start_mlserver(work / "mlserver", work / "mlserver.log")
        running: dict[str, tuple[list[subprocess.Popen], dict[str, int]]] = {}
        try:
            for server, launch in starts.items():
                running[server] = launch()
            # every server up at once (idle ones cost next to nothing), measured case by case, back to back:
            # on a shared, noisy box the figures of one row are then taken within the same minute
            for case in cases:
                for server, (_, ports) in running.items():
                    if server not in case.servers:
                        continue
                    if server != "MLServer":
                        model = case.ours_model if server == "ours" else ""
                        pa[(server, case.label)] = measure_pa(tool, case, ports, seconds, work, model)
                    if "MLServer" in case.servers and server in ("ours", "MLServer") and case.tensor_format != "binary":
                        # MLServer: no binary extension
                        tc[(server, case.label)] = asyncio.run(drive(case, ports[case.protocol], seconds))
        finally:
            for procs, _ in running.values():
                for proc in procs:
                    proc.terminate()
            for procs, _ in running.values():
                for proc in procs:
                    proc.wait(60)
        startup = cold_start(work)
    print("perf_analyzer: ours, Triton 2.51, ceiling; tritonclient closed loop: ours, MLServer 1.7. "
          "Cells: throughput (p50 / p99 ms).")
    print("| case | ours | Triton 2.51 | ceiling | ours / Triton | ours / ceiling | ours (tritonclient) "
          "| MLServer 1.7 (tritonclient) | ours / MLServer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        ours, theirs = pa.get(("ours", case.label)), pa.get(("Triton", case.label))
        top, ours_tc, mls = pa.get(("ceiling", case.label)), tc.get(("ours", case.label)), tc.get(("MLServer", case.label))
        print(f"| {case.label} | {_cell(ours, case)} | {_cell(theirs, case)} | {_cell(top, case)} | {ratio(ours, theirs)} "
              f"| {ratio(ours, top)} | {_cell(ours_tc, case)} | {_cell(mls, case)} | {ratio(ours_tc, mls)} |")
    print(f"| cold start to ready (example repository) | {startup['ready s']:.2f} s | | | | | | | |")
    print(f"| idle RSS | {startup['idle RSS MiB']:.0f} MiB | | | | | | | |")
    if not ((ROOT.parent / "shared" / "models" / MINILM).is_dir() or (EXAMPLES / MINILM / "1" / "tokenizer.json").is_file()):
        print(f"/v1/encode: skipped, no {MINILM} (keep ../shared beside the project or run `make models`)")
        return
    encode = [sys.executable, str(HERE / "encode.py")] + (["--smoke"] if args.smoke else [])
    subprocess.run(encode, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _ours(work: Path) -> tuple[list[subprocess.Popen], dict[str, int]]:
    extra = work / "ours-extra"  # simple_python run in stub processes
    shutil.copytree(EXAMPLES / "simple_python", extra / PROCESS_MODEL)
    config = extra / PROCESS_MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple_python"', f'name: "{PROCESS_MODEL}"')
                      + 'parameters: { key: "EXECUTION_MODE" value: { string_value: "process" } }\n')
    proc, ports = start_server(EXAMPLES, work / "ours.log", "--model-repository", str(extra), "--model-control-mode",
                               "explicit", "--load-model", "simple", "--load-model", "identity_fp32", "--load-model",
                               "simple_python", "--load-model", PROCESS_MODEL)
    return [proc], ports


if __name__ == "__main__":
    main()
