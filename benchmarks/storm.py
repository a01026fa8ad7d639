"""Soak and storm under attack: does one hostile or heavy request stall, bloat or break the others?

Starts a server (explicit mode, client shared memory on) with Triton's `simple` and two identity
models (FP32 and BYTES, any length), then runs each attack while probe clients on the other
transport time a health check and a small `simple` infer every 20 ms. For each case it prints
the probes' p50 / p99 / max latency (ms), probe errors, the attack's outcome, and the server's
peak RSS growth during the case (VmHWM after minus VmRSS before, /proc; peak reset per case), with
the JSON worker process's own peak beside it once it exists.

Attacks: the largest legal JSON body (FP32, just under --http-max-input-size), a 64 MiB binary
REST body, a flood of zero-length BYTES elements over gRPC (legal, and one over the memory
limit), a region shrunk after registration, 5,000 unload calls for unknown names, a model control
storm (a model loaded and unloaded over and over while fresh connections infer on it and on
`simple`: wrong answers, and whether every replica ends with the same models), and a soak of
`simple` at concurrency 16 (RSS growth and errors). ``--workers N`` runs the server with N replicas
(the RSS figures are then the supervisor's).

Usage: python benchmarks/storm.py [--seconds 20] [--smoke] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper

from perf import ROOT, start_server

EXAMPLES = ROOT / "examples" / "model_repository"
PROBE_EVERY_S = 0.02
STORMED = "storm_simple"
SIMPLE_BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()
FRESH = 12  # fresh connections that must all agree at the end (each may reach any replica)


def identity(onnx_type: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
                              [helper.make_tensor_value_info("INPUT0", onnx_type, [None])],
                              [helper.make_tensor_value_info("OUTPUT0", onnx_type, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def repository(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    (repo / "simple").symlink_to(EXAMPLES / "simple")
    (repo / STORMED / "1").mkdir(parents=True)  # `simple` under another name, loaded and unloaded by control_storm
    (repo / STORMED / "1" / "model.onnx").symlink_to(EXAMPLES / "simple" / "1" / "model.onnx")
    (repo / STORMED / "config.pbtxt").write_text(
        (EXAMPLES / "simple" / "config.pbtxt").read_text().replace('name: "simple"', f'name: "{STORMED}"'))
    for name, kind in (("identity_fp32", TensorProto.FLOAT), ("identity_bytes", TensorProto.STRING)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(identity(kind).SerializeToString())
        datatype = "TYPE_FP32" if kind == TensorProto.FLOAT else "TYPE_STRING"
        (repo / name / "config.pbtxt").write_text(
            "max_batch_size: 0\ninstance_group [{ count: 1, kind: KIND_CPU }]\n"
            f'input [{{ name: "INPUT0", data_type: {datatype}, dims: [-1] }}]\n'
            f'output [{{ name: "OUTPUT0", data_type: {datatype}, dims: [-1] }}]\n')
    return repo


def status_kib(pid: int, field: str) -> int:
    """A /proc/<pid>/status field in KiB (0 when the process is a zombie or gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), 0)
    except OSError:
        return 0


def children(pid: int) -> list[int]:
    """The server's child processes (its JSON worker)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        pass
    return found


def reset_peak(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (Linux >= 4.0)
    except OSError:
        pass


class Probe:
    """Times a health check and a small `simple` infer over one transport, every 20 ms, in a thread."""

    def __init__(self, transport: str, ports: dict[str, int]) -> None:
        self.transport = transport
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        if transport == "grpc":
            self._client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
            module = grpcclient
        else:
            self._client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}", network_timeout=60)
            module = httpclient
        self._inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in self._inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for call in (lambda: self._client.is_server_live(), lambda: self._client.infer("simple", self._inputs)):
                started = time.perf_counter()
                try:
                    call()
                except Exception:  # noqa: BLE001 - counted
                    self.errors += 1
                self.latencies.append((time.perf_counter() - started) * 1000)
            self._stop.wait(PROBE_EVERY_S)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        if not self.latencies:
            return "no probe"
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (f"{self.transport} probes n={len(ordered)} p50 {statistics.median(ordered):.1f} p99 {p99:.1f} "
                f"max {ordered[-1]:.1f} ms, errors {self.errors}")


def case(name: str, pid: int, ports: dict[str, int], probe_on: str, attack: Callable[[], str]) -> None:
    if not Path(f"/proc/{pid}/status").exists() or status_kib(pid, "VmRSS") == 0:
        print(f"| {name} | - | server is gone | - | - |", flush=True)
        return
    for process in [pid, *children(pid)]:
        reset_peak(process)
    before = status_kib(pid, "VmRSS")
    started = time.perf_counter()
    with Probe(probe_on, ports) as probe:
        time.sleep(0.3)
        try:
            outcome = attack()
        except Exception as err:  # noqa: BLE001 - reported
            outcome = f"failed: {str(err)[:120]}"
        time.sleep(0.3)
    if not Path(f"/proc/{pid}/status").exists() or status_kib(pid, "VmHWM") == 0:
        print(f"| {name} | - | {outcome}; the server died | {probe.summary()} | - |", flush=True)
        return
    peak = status_kib(pid, "VmHWM")
    worker = max((status_kib(child, "VmHWM") for child in children(pid)), default=0)
    print(f"| {name} | {time.perf_counter() - started:.1f} s | {outcome} | {probe.summary()} | "
          f"peak RSS +{(peak - before) / 1024:.0f} MiB" + (f" (JSON worker peak {worker / 1024:.0f} MiB)" if worker else "")
          + " |", flush=True)


def http_post(port: int, path: str, body: bytes, headers: dict[str, str]) -> str:
    """POST ``body`` to the server's HTTP port; "HTTP <status>" (600 s timeout)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"


def json_attack(ports: dict[str, int], max_bytes: int) -> Callable[[], str]:
    count = (max_bytes - 400) // 4
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": []}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = head.replace(b'"data": []', b'"data": [' + b"0.5," * (count - 1) + b"0.5]")
    return lambda: http_post(ports["http"], "/v2/models/identity_fp32/infer", body, {"Content-Type": "application/json"}) + \
        f", {len(body) / 2**20:.0f} MiB JSON"


def binary_attack(ports: dict[str, int], max_bytes: int) -> Callable[[], str]:
    count = (max_bytes - 400) // 4
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count],
                                   "parameters": {"binary_data_size": count * 4}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = head + np.zeros(count, np.float32).tobytes()
    return lambda: http_post(ports["http"], "/v2/models/identity_fp32/infer", body,
                             {"Inference-Header-Content-Length": str(len(head))}) + f", {len(body) / 2**20:.0f} MiB"


def bytes_flood(ports: dict[str, int], count: int) -> Callable[[], str]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    tensor = grpcclient.InferInput("INPUT0", [count], "BYTES")
    tensor._raw_content = b"\0\0\0\0" * count  # zero-length elements, framed as tritonclient frames them
    tensor._input.ClearField("contents")

    def attack() -> str:
        try:
            client.infer("identity_bytes", [tensor], client_timeout=300)
            return f"OK, {count * 4 / 2**20:.0f} MiB, {count:,} elements"
        except Exception as err:  # noqa: BLE001 - the status is the outcome
            return f"{err.status()} ({count:,} elements)"  # type: ignore[attr-defined]
    return attack


def shrink_attack(ports: dict[str, int]) -> str:
    key = f"/storm_{os.getpid()}"
    handle = shm.create_shared_memory_region("storm", key, 2 * 4096)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    try:
        client.register_system_shared_memory("storm", key, 2 * 4096)
        os.truncate(f"/dev/shm{key}", 0)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("storm", 64, offset=4096)
        inputs[1].set_shared_memory("storm", 64, offset=4096 + 64)
        try:
            client.infer("simple", inputs)
            return "answered?"
        except Exception as err:  # noqa: BLE001 - the status is the outcome
            return str(err.status())  # type: ignore[attr-defined]
    finally:
        client.unregister_system_shared_memory("storm")
        shm.destroy_shared_memory_region(handle)


def unload_storm(ports: dict[str, int], names: int) -> str:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    for i in range(names):
        client.unload_model(f"storm-{i}-" + "x" * 200)
    return f"{names:,} unknown names unloaded"


def _fresh(port: int, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One request on a connection of its own (urllib opens one per request): status and body."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def control_storm(ports: dict[str, int], seconds: float) -> str:
    """Two clients load and unload ``STORMED`` over and over while four infer on it and on `simple`,
    each request on a fresh connection; then the model is loaded, and unloaded, once more and
    ``FRESH`` fresh connections must all see each. Wrong: a 200 whose outputs are not INPUT0 + INPUT1."""
    deadline = time.monotonic() + seconds
    counts = {"ok": 0, "wrong": 0, "refused": 0, "other errors": 0, "loads": 0, "unloads": 0}
    lock = threading.Lock()

    def count(key: str) -> None:
        with lock:
            counts[key] += 1

    def control() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        while time.monotonic() < deadline:
            for action, key in ((client.load_model, "loads"), (client.unload_model, "unloads")):
                try:
                    action(STORMED)
                    count(key)
                except Exception:  # noqa: BLE001 - counted
                    count("other errors")

    def infer() -> None:
        while time.monotonic() < deadline:
            for model in (STORMED, "simple"):
                status, body = _fresh(ports["http"], f"/v2/models/{model}/infer", SIMPLE_BODY)
                if status == 200:
                    right = json.loads(body)["outputs"][0]["data"] == list(range(1, 17))
                    count("ok" if right else "wrong")
                else:  # only the stormed model may be away (not loaded, unloading: 400 / 404 / 503)
                    count("refused" if model == STORMED and status in (400, 404, 503) else "other errors")

    with ThreadPoolExecutor(6) as pool:
        for done in [pool.submit(control) for _ in range(2)] + [pool.submit(infer) for _ in range(4)]:
            done.result()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    client.load_model(STORMED)
    loaded = sum(_fresh(ports["http"], f"/v2/models/{STORMED}/ready")[0] == 200 for _ in range(FRESH))
    client.unload_model(STORMED)
    unloaded = sum(_fresh(ports["http"], f"/v2/models/{STORMED}/ready")[0] == 400 for _ in range(FRESH))
    return (f"{counts['ok']:,} right answers, {counts['wrong']} wrong, {counts['refused']:,} refused while away, "
            f"{counts['other errors']} other errors; {counts['loads']} loads, {counts['unloads']} unloads; then "
            f"loaded on {loaded}/{FRESH} and unloaded on {unloaded}/{FRESH} fresh connections")


def soak(ports: dict[str, int], seconds: float) -> str:
    errors, done = 0, 0
    deadline = time.monotonic() + seconds

    def worker() -> tuple[int, int]:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        ok = bad = 0
        while time.monotonic() < deadline:
            try:
                client.infer("simple", inputs)
                ok += 1
            except Exception:  # noqa: BLE001 - counted
                bad += 1
        return ok, bad

    with ThreadPoolExecutor(16) as pool:
        for ok, bad in pool.map(lambda _: worker(), range(16)):
            done, errors = done + ok, errors + bad
    return f"{done:,} infers at c=16, {errors} errors"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="soak length")
    parser.add_argument("--smoke", action="store_true", help="small sizes, short soak (CI)")
    parser.add_argument("--workers", default="1", help="the server's --workers")
    args = parser.parse_args()
    scale = 16 if args.smoke else 1
    max_bytes = 64 * 2**20 // scale
    with tempfile.TemporaryDirectory() as tmp:
        repo = repository(Path(tmp))
        proc, ports = start_server(repo, Path(tmp) / "server.log", "--model-control-mode", "explicit",
                                   "--load-model", "*", "--allow-client-shm", "true",
                                   "--http-max-input-size", str(max_bytes), "--workers", args.workers)
        try:
            pid = proc.pid
            print("| case | time | outcome | probes | peak RSS growth |\n|---|---|---|---|---|")
            case("idle (baseline)", pid, ports, "grpc", lambda: time.sleep(2) or "-")
            case("largest legal JSON body (REST)", pid, ports, "grpc", json_attack(ports, max_bytes))
            case("64 MiB binary body (REST)", pid, ports, "grpc", binary_attack(ports, max_bytes))
            case("BYTES flood, legal (gRPC)", pid, ports, "http", bytes_flood(ports, 2_000_000 // scale))
            case("BYTES flood, 4M elements (gRPC)", pid, ports, "http", bytes_flood(ports, 4_000_000 // scale))
            case("shared memory shrunk after register", pid, ports, "http", lambda: shrink_attack(ports))
            case("unload storm, unknown names", pid, ports, "http", lambda: unload_storm(ports, 5000 // scale))
            case("model control storm", pid, ports, "grpc", lambda: control_storm(ports, args.seconds / (4 if args.smoke else 2)))
            before = status_kib(pid, "VmRSS")
            case("soak simple c=16 (gRPC)", pid, ports, "http", lambda: soak(ports, args.seconds / (4 if args.smoke else 1)))
            print(f"\nRSS after soak vs before: {(status_kib(pid, 'VmRSS') - before) / 1024:+.1f} MiB; "
                  f"server alive: {proc.poll() is None} (exit status {proc.returncode})")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    sys.exit(0 if proc.returncode == 0 else 1)


if __name__ == "__main__":
    main()
