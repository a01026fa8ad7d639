"""Throughput and latency with Triton's perf_analyzer, against a server started here.

gRPC: `simple` at concurrency 1, 4 and 16 (dynamic batching on, as auto-complete sets it), the
same graph without batching (`simple_unbatched`: max_batch_size 1) at concurrency 16, and the
FP32 identity model with 1 MiB and 16 MiB tensors at concurrency 4, over gRPC and over system
shared memory (`--shared-memory system`, the server run with `--allow-client-shm true`). REST: `simple` at concurrency 4 with JSON and with binary tensors.
Then `simple` over gRPC at concurrency 4 again on a second server started with metrics off, so
the cost of metrics shows as a ratio. Prints infer/s, p50/p99 latency (ms) and payload MB/s
(request bytes, one direction). perf_analyzer comes from PATH, else from ../shared/tools (a wrapper
for machines whose glibc is too old for the PyPI wheel), else `pip install perf-analyzer`.

Usage: python benchmarks/perf.py [--seconds 5] [--repository examples/model_repository]
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SHARED_TOOLS = ROOT.parent / "shared" / "tools"
FP32_ELEMENTS = {"1 MiB": 256 * 1024, "16 MiB": 4 * 1024 * 1024}


def perf_analyzer() -> str:
    found = shutil.which("perf_analyzer")
    if found:
        return found
    if (SHARED_TOOLS / "perf_analyzer").exists():
        return str(SHARED_TOOLS / "perf_analyzer")
    sys.exit("perf_analyzer not found: put it on PATH (pip install perf-analyzer) or keep ../shared/tools beside the project")


def start_server(repository: Path, log: Path, *extra: str, source: Path | None = None, path: Path | None = None
                 ) -> tuple[subprocess.Popen, dict[str, int]]:
    """Our server on free ports, from this checkout or from ``source`` (another checkout, for before/after);
    ``path``: a folder ahead of both on PYTHONPATH (another build of ONNX Runtime)."""
    out = open(log, "w")
    paths = [str(folder) for folder in (path, source) if folder is not None]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"} | ({"PYTHONPATH": os.pathsep.join(paths)} if paths else {})
    proc = subprocess.Popen([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
                             "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-address", "127.0.0.1",
                             "--http-port", "0", "--metrics-port", "0", *extra], stdout=out, stderr=subprocess.STDOUT,
                            env=env, cwd=source)
    for _ in range(600):
        text = log.read_text()
        ports = dict(re.findall(r"(gRPC|HTTP) server listening on [^:]+:(\d+)", text))
        if len(ports) == 2 and "server is ready" in text:
            return proc, {"grpc": int(ports["gRPC"]), "http": int(ports["HTTP"])}
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"server did not become ready:\n{log.read_text()}")


def unbatched_repository(source: Path, target: Path) -> Path:
    """A repository with `simple_unbatched`: `simple`'s graph and config with max_batch_size 1 (no batcher)."""
    folder = target / "simple_unbatched"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes((source / "simple" / "1" / "model.onnx").read_bytes())
    config = (source / "simple" / "config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(config.replace('name: "simple"', 'name: "simple_unbatched"')
                                         .replace("max_batch_size: 8", "max_batch_size: 1"))
    return target


# perf_analyzer 2.60 holds memory for every request it sends until it exits (about 1.3 GB per 1,000 requests
# of 1 MiB), and over HTTP its time windows of 1 MiB tensors ran on past 20 s until it was OOM-killed at
# 22 GB: tensors of 1 MiB and more are measured over windows of a request count instead, each moving at
# most this many tensor bytes
WINDOW_BYTES = 256 * 2**20


def tensor_window(tensor_bytes: int, seconds: float) -> int | None:
    """Requests per measurement window for tensors of ``tensor_bytes`` (about ``seconds`` at 100
    infer/s, at most ``WINDOW_BYTES``, at least 10); None below 1 MiB: time windows of ``seconds``."""
    if tensor_bytes < 2**20:
        return None
    return max(10, min(int(seconds * 100), WINDOW_BYTES // tensor_bytes))


# perf_analyzer has also run away in windows of a request count: 22 GB of 1 MiB requests, once in a
# suite run on a loaded box, where a quiet run peaks near 4 GB (about 2,000 requests held). It is
# stopped at twice that, before the kernel's OOM killer picks it or a neighbour, and a runaway (or
# an OOM kill, also SIGKILL) is tried once more
MAX_RSS = 8 * 2**30
RUNAWAY = -9  # the exit code of a killed perf_analyzer, by us or by the OOM killer


def _watched(command: list[str], env: dict[str, str] | None) -> int:
    """Run perf_analyzer; its exit code, or RUNAWAY when it (with any child of a wrapper) passed
    MAX_RSS and was killed."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    watched = psutil.Process(proc.pid)
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        try:
            if sum(p.memory_info().rss for p in (watched, *watched.children(recursive=True))) > MAX_RSS:
                proc.kill()
                proc.wait()
                print(f"perf_analyzer passed {MAX_RSS >> 20} MiB resident and was stopped", file=sys.stderr)
                return RUNAWAY
        except psutil.NoSuchProcess:
            pass


def run(tool: str, ports: dict[str, int], model: str, concurrency: int, seconds: float, shape: str | None,
        workdir: Path, protocol: str = "grpc", tensor_format: str | None = None, shm_bytes: int = 0,
        stability: int = 25, window_requests: int | None = None, env: dict[str, str] | None = None) -> dict[str, float]:
    """One perf_analyzer measurement: infer/s and p50/p99 latency in ms (``stability``: percent, a
    large value takes the first three windows as they are; ``window_requests``: windows of that many
    requests instead of ``seconds``; ``env``: perf_analyzer's environment, this process's by default)."""
    report = workdir / f"{protocol}-{model}-{concurrency}-{shape or 'default'}-{tensor_format}-{shm_bytes}.csv".replace(":", "_")
    windows = (["--measurement-interval", str(int(seconds * 1000))] if window_requests is None else
               ["--measurement-mode", "count_windows", "--measurement-request-count", str(window_requests)])
    command = [tool, "-m", model, "-i", protocol, "-u", f"127.0.0.1:{ports[protocol]}", "--concurrency-range", str(concurrency),
               *windows, "--max-trials", "10", "--stability-percentage", str(stability), "-f", str(report)]
    if shape:
        command += ["--shape", shape]
    if tensor_format:
        command += ["--input-tensor-format", tensor_format, "--output-tensor-format", tensor_format]
    if shm_bytes:
        command += ["--shared-memory", "system", "--output-shared-memory-size", str(shm_bytes)]
    for attempt in (1, 2):  # a runaway is tried once more; any other failure is reported at once
        code = _watched(command, env)
        if code != RUNAWAY or attempt == 2:
            break
    if code:
        raise subprocess.CalledProcessError(code, command)
    with open(report) as f:
        row = next(csv.DictReader(f))
    return {"infer/s": float(row["Inferences/Second"]), "p50 ms": float(row["p50 latency"]) / 1000,
            "p99 ms": float(row["p99 latency"]) / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="measurement window per trial")
    parser.add_argument("--repository", type=Path, default=ROOT / "examples" / "model_repository")
    args = parser.parse_args()
    tool = perf_analyzer()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        extra = unbatched_repository(args.repository, workdir / "extra")
        proc, ports = start_server(args.repository, workdir / "server.log", "--model-repository", str(extra),
                                   "--allow-client-shm", "true")
        rows = []
        try:
            for concurrency in (1, 4, 16):
                result = run(tool, ports, "simple", concurrency, args.seconds, None, workdir)
                rows.append((f"grpc simple c={concurrency}", 64 * 2, result))
            result = run(tool, ports, "simple_unbatched", 16, args.seconds, None, workdir)
            rows.append(("grpc simple c=16 no batching", 64 * 2, result))
            for label, elements in FP32_ELEMENTS.items():
                window = tensor_window(elements * 4, args.seconds)
                result = run(tool, ports, "identity_fp32", 4, args.seconds, f"INPUT0:{elements}", workdir,
                             window_requests=window)
                rows.append((f"grpc identity_fp32 {label} c=4", elements * 4, result))
                result = run(tool, ports, "identity_fp32", 4, args.seconds, f"INPUT0:{elements}", workdir,
                             shm_bytes=elements * 4, window_requests=window)
                rows.append((f"shm identity_fp32 {label} c=4", elements * 4, result))
            for tensor_format in ("json", "binary"):
                result = run(tool, ports, "simple", 4, args.seconds, None, workdir, "http", tensor_format)
                rows.append((f"http simple {tensor_format} c=4", 64 * 2, result))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        proc, ports = start_server(args.repository, workdir / "server-no-metrics.log", "--allow-metrics", "false")
        try:
            rows.append(("grpc simple c=4 metrics off", 64 * 2, run(tool, ports, "simple", 4, args.seconds, None, workdir)))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    print(f"{'case':<33}{'infer/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'MB/s':>9}")
    for label, request_bytes, result in rows:
        mb_s = result["infer/s"] * request_bytes / 1e6
        print(f"{label:<33}{result['infer/s']:>10.0f}{result['p50 ms']:>9.2f}{result['p99 ms']:>9.2f}{mb_s:>9.1f}")
    on, off = (dict((label, r) for label, _, r in rows)[k]["infer/s"] for k in ("grpc simple c=4", "grpc simple c=4 metrics off"))
    print(f"metrics on / off at c=4: {on / off:.3f}")
    batched, unbatched = (dict((label, r) for label, _, r in rows)[k]["infer/s"]
                          for k in ("grpc simple c=16", "grpc simple c=16 no batching"))
    print(f"dynamic batching on / off at c=16: {batched / unbatched:.3f}")


if __name__ == "__main__":
    main()
