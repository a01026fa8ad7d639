"""Peak RSS per request against its wire size: how much memory one large request costs the server.

Starts a server with an FP32 and a BYTES identity model (any length) for each case (memory that
an earlier case freed would hide growth) and sends one large request over gRPC or REST. For each it prints the bytes sent, the server's peak RSS growth
during the request (VmHWM after minus VmRSS before, /proc; the peak is reset per case), that growth
divided by the wire size, and the JSON worker process's own peak growth where one decoded it (the
worker is started before the case).

``--source DIR`` runs each case on a server from another checkout as well (``git worktree add
/tmp/before main``), one after the other, to compare before and after in one sitting.

Usage: python benchmarks/memory.py [--scale 1] [--case NAME ...] [--source DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from perf import start_server
from storm import children, http_post, repository, reset_peak, status_kib

MIB = 2**20


def grpc_bytes(port: int, count: int, element: bytes) -> tuple[int, Callable[[], str]]:
    """gRPC BYTES identity, ``count`` copies of ``element``, framed as tritonclient frames them."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("INPUT0", [count], "BYTES")
    tensor._raw_content = (len(element).to_bytes(4, "little") + element) * count
    tensor._input.ClearField("contents")
    wire = len(tensor._raw_content)

    def send() -> str:
        try:
            client.infer("identity_bytes", [tensor], client_timeout=600)
            return "OK"
        except Exception as err:  # noqa: BLE001 - the status is the outcome
            return str(err.status())  # type: ignore[attr-defined]
    return wire, send


def grpc_fp32(port: int, count: int, model: str = "identity_fp32") -> tuple[int, Callable[[], str]]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("INPUT0", [count], "FP32")
    tensor.set_data_from_numpy(np.full(count, 0.5, np.float32))

    def send() -> str:
        client.infer(model, [tensor], client_timeout=600)
        return "OK"
    return count * 4, send


def without_arena(repo: Path) -> Path:
    """Add ``identity_fp32_no_arena``: identity_fp32 with ONNX Runtime's CPU memory arena off
    (``enable_mem_arena: 0``), whose output buffer goes back to the system once the response is
    written instead of staying in the arena for later requests."""
    source, target = repo / "identity_fp32", repo / "identity_fp32_no_arena"
    (target / "1").mkdir(parents=True)
    (target / "1" / "model.onnx").write_bytes((source / "1" / "model.onnx").read_bytes())
    (target / "config.pbtxt").write_text((source / "config.pbtxt").read_text()
                                         + 'parameters { key: "enable_mem_arena" value: { string_value: "0" } }\n')
    return repo


def rest_json_fp32(port: int, count: int) -> tuple[int, Callable[[], str]]:
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": []}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = head.replace(b'"data": []', b'"data": [' + b"0.5," * (count - 1) + b"0.5]")
    return len(body), lambda: http_post(port, "/v2/models/identity_fp32/infer", body,
                                        {"Content-Type": "application/json"})


def rest_json_bytes(port: int, count: int, element: str) -> tuple[int, Callable[[], str]]:
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [count], "data": []}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    item = json.dumps(element).encode()
    body = head.replace(b'"data": []', b'"data": [' + b",".join([item] * count) + b"]")
    return len(body), lambda: http_post(port, "/v2/models/identity_bytes/infer", body,
                                        {"Content-Type": "application/json"})


def rest_binary_fp32(port: int, count: int) -> tuple[int, Callable[[], str]]:
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count],
                                   "parameters": {"binary_data_size": count * 4}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = head + np.zeros(count, np.float32).tobytes()
    return len(body), lambda: http_post(port, "/v2/models/identity_fp32/infer", body,
                                        {"Inference-Header-Content-Length": str(len(head))})


def cases(ports: dict[str, int], scale: float) -> dict[str, Callable[[], tuple[int, Callable[[], str]]]]:
    n = lambda count: max(int(count * scale), 1)  # noqa: E731
    g, h = ports["grpc"], ports["http"]
    return {
        "grpc-bytes-empty": lambda: grpc_bytes(g, n(4_000_000), b""),
        "grpc-bytes-16": lambda: grpc_bytes(g, n(1_000_000), b"sixteen byte str"),
        "grpc-bytes-1k": lambda: grpc_bytes(g, n(16_000), b"x" * 1024),
        "grpc-fp32": lambda: grpc_fp32(g, n(8_000_000)),
        "grpc-fp32-no-arena": lambda: grpc_fp32(g, n(8_000_000), "identity_fp32_no_arena"),
        "rest-binary-fp32": lambda: rest_binary_fp32(h, n(16_000_000)),
        "rest-json-fp32": lambda: rest_json_fp32(h, n(16_000_000)),
        "rest-json-bytes-16": lambda: rest_json_bytes(h, n(1_000_000), "sixteen byte str"),
    }


def measure(pid: int, make: Callable[[], tuple[int, Callable[[], str]]]) -> tuple[int, str, int, int]:
    """(wire bytes, outcome, server peak growth, worker peak growth), in bytes."""
    wire, send = make()
    time.sleep(0.5)
    for process in [pid, *children(pid)]:
        reset_peak(process)
    before = status_kib(pid, "VmRSS")
    workers_before = {child: status_kib(child, "VmRSS") for child in children(pid)}
    outcome = send()
    peak = status_kib(pid, "VmHWM") - before
    worker = max((status_kib(child, "VmHWM") - workers_before.get(child, 0) for child in children(pid)), default=0)
    return wire, outcome, peak * 1024, worker * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every element count")
    parser.add_argument("--case", action="append", help="run only these cases")
    parser.add_argument("--source", type=Path, help="also run each case on a server from this checkout")
    args = parser.parse_args()
    sources: dict[str, Path | None] = {"": None} | ({f" ({args.source.name})": args.source.resolve()}
                                                   if args.source else {})
    print("| case | wire | outcome | server peak RSS growth | / wire | JSON worker peak growth |")
    print("|---|---|---|---|---|---|")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        repo = without_arena(repository(Path(tmp)))
        for name, (label, source) in ((n, s) for n in cases({"grpc": 0, "http": 0}, args.scale)
                                      for s in sources.items()):
            if args.case and name not in args.case:
                continue
            # a fresh server per case: memory an earlier case freed (kept by the allocator) would hide growth
            proc, ports = start_server(repo, Path(tmp) / f"{name}.log", "--http-max-input-size", str(128 * MIB),
                                       "--max-request-decoded-bytes", str(8 * 2**30),
                                       "--request-memory-pool-bytes", str(8 * 2**30), source=source)
            try:
                make = cases(ports, args.scale)[name]
                grpc_bytes(ports["grpc"], 100, b"warm")[1]()
                grpc_fp32(ports["grpc"], 100)[1]()
                if name.startswith("rest-json"):
                    rest_json_fp32(ports["http"], 300_000)[1]()  # starts the JSON worker: its own start is not counted
                wire, outcome, peak, worker = measure(proc.pid, make)
                print(f"| {name}{label} | {wire / MIB:.1f} MiB | {outcome} | {peak / MIB:.0f} MiB | {peak / wire:.1f}x | "
                      + (f"{worker / MIB:.0f} MiB ({worker / wire:.1f}x)" if worker > 0 else "-") + " |", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            failed = failed or proc.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
