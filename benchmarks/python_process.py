"""Python models in process and in stub processes (``EXECUTION_MODE`` ``process``): does pure-Python
CPU in ``execute`` use more than one core?

One server, two python models with 2 instances each whose ``execute`` burns ``--burn-ms`` of
pure-Python CPU per request (its thread's CPU clock): ``burn_in_process`` and ``burn_process``. For
each, gRPC clients (tritonclient, one thread each) send requests for ``--seconds`` at concurrency 1
and 4; the table shows infer/s (median of ``--rounds`` rounds, which alternate between the models)
and the c=4 / c=1 ratio (at most 2 with 2 instances; in process the GIL keeps it near 1). It also
prints the peak RSS (``VmHWM`` of ``/proc/<pid>/status``) of each stub process right after the load
(idle) and after the run. The machine may be shared: compare figures of one sitting only.

Usage: python benchmarks/python_process.py [--seconds 5] [--rounds 3] [--burn-ms 2] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from processes import wait_http  # noqa: E402 - sibling module

MODES = ("in_process", "process")
CONCURRENCY = (1, 4)
MODEL = '''
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    BURN_S = {burn_s}


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                start, total = time.thread_time(), 0
                while time.thread_time() - start < BURN_S:  # pure-Python CPU, holding the GIL
                    for i in range(200):
                        total += i * i
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + np.float32(total % 2))]))
            return responses
'''
CONFIG = '''name: "{name}"
backend: "python"
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }}]
instance_group [{{ count: 2 kind: KIND_CPU }}]
parameters: {{ key: "EXECUTION_MODE" value: {{ string_value: "{mode}" }} }}
'''


def _repository(root: Path, burn_ms: float) -> Path:
    for mode in MODES:
        folder = root / f"burn_{mode}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(CONFIG.format(name=folder.name, mode=mode))
        (folder / "1" / "model.py").write_text(textwrap.dedent(MODEL.format(burn_s=burn_ms / 1000)))
    return root


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rate(url: str, model: str, concurrency: int, seconds: float) -> float:
    """Requests answered per second by ``concurrency`` clients, each waiting for its answer before the next
    (connections made and warmed before the clock starts)."""
    counts = [0] * concurrency
    ready = threading.Barrier(concurrency + 1, timeout=60)
    stop = threading.Event()
    failures: list[BaseException] = []

    def client(index: int) -> None:
        try:
            with grpcclient.InferenceServerClient(url) as connection:
                tensor = grpcclient.InferInput("X", [4], "FP32")
                tensor.set_data_from_numpy(np.ones(4, np.float32))
                connection.infer(model, [tensor])  # warm: not counted
                ready.wait()
                while not stop.is_set():
                    connection.infer(model, [tensor])
                    counts[index] += 1
        except BaseException as err:  # the harness fails, saying why
            failures.append(err)
            ready.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        stop.set()
        for thread in threads:
            thread.join()
        raise SystemExit(f"{model} c={concurrency}: {failures[0] if failures else 'clients did not start'}") from None
    start = time.monotonic()
    time.sleep(seconds)
    stop.set()
    answered = sum(counts)  # those answered within the window (one in flight per client may end after it)
    elapsed = time.monotonic() - start
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{model} c={concurrency}: {failures[0]}")
    return answered / elapsed


def _stubs(server_pid: int) -> list[int]:
    """The stub processes of the server (its children running ``kserve_v2.runtime.python.stub``)."""
    found = []
    for task in Path(f"/proc/{server_pid}/task").iterdir():  # a child belongs to the thread that started it
        for child in (task / "children").read_text().split():
            if b"kserve_v2.runtime.python.stub" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
    return sorted(found)


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each measurement sends requests")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating between the modes (median)")
    parser.add_argument("--burn-ms", type=float, default=2.0, help="pure-Python CPU per request, ms")
    parser.add_argument("--smoke", action="store_true", help="one short round (checks the harness, not a speed)")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 0.5, 1
    with tempfile.TemporaryDirectory() as folder:
        repository = _repository(Path(folder) / "models", args.burn_ms)
        grpc_port, http_port = _free_port(), _free_port()
        log = Path(folder) / "server.log"
        with open(log, "w") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-address", "127.0.0.1",
                 "--http-port", str(http_port), "--allow-metrics", "false"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            wait_http(server, f"http://127.0.0.1:{http_port}/v2/health/ready", log, "the server")
            stubs = _stubs(server.pid)
            idle = [_peak_mib(pid) for pid in stubs]
            url = f"127.0.0.1:{grpc_port}"
            rates: dict[tuple[str, int], list[float]] = {(m, c): [] for m in MODES for c in CONCURRENCY}
            for _ in range(args.rounds):
                for concurrency in CONCURRENCY:
                    for mode in MODES:
                        rates[mode, concurrency].append(_rate(url, f"burn_{mode}", concurrency, args.seconds))
            after = [_peak_mib(pid) for pid in stubs]
        finally:
            server.terminate()
            server.wait(60)
    median = {key: statistics.median(values) for key, values in rates.items()}
    print(f"python model burning {args.burn_ms:g} ms of pure-Python CPU per request, 2 instances, gRPC, "
          f"{args.rounds} round(s) of {args.seconds:g} s\n")
    print("| mode | c=1 infer/s | c=4 infer/s | c=4 / c=1 |")
    print("|---|---|---|---|")
    for mode in MODES:
        one, four = median[mode, 1], median[mode, 4]
        print(f"| {mode} | {one:.1f} | {four:.1f} | {four / one:.2f} |")
    print(f"\nprocess / in_process at c=4: {median['process', 4] / median['in_process', 4]:.2f}x; "
          f"at c=1: {median['process', 1] / median['in_process', 1]:.2f}x")
    print(f"stub processes: {len(stubs)}; peak RSS (VmHWM) idle after load: "
          f"{', '.join(f'{m:.1f}' for m in idle)} MiB; after the run: {', '.join(f'{m:.1f}' for m in after)} MiB")


if __name__ == "__main__":
    main()
