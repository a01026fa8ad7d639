"""What a reload costs the requests in flight around it: latency of a steady gRPC caller while poll mode loads
new versions of a model.

One server per checkout (this one, and ``--source DIR`` for another, e.g. ``git worktree add /tmp/before
HEAD~1``), each in poll mode (``--repository-poll-secs 1``) on its own copy of examples/model_repository's
``simple``. One tritonclient gRPC caller sends ``simple`` one request at a time, ``--pause-ms`` apart; after a
steady phase, ``--reloads`` new versions are written (a folder renamed into place, so each poll sees a whole
version), ``--every`` seconds apart. Each new version is a load and the retirement of the version it replaces.
The table gives p50, p99 and the slowest request of the steady phase and of the reload phase, and the slowest
request of each reload's window (from the upload until the poll after next, two poll periods). A reload that
stalls the event loop shows as a slowest request far above the steady one, in every window. The machine may be
shared: compare figures of one sitting only, servers run one after the other.

Usage: python benchmarks/reload_stall.py [--reloads 6] [--every 2.5] [--steady 5] [--source DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from processes import wait_http  # noqa: E402 - sibling module

SIMPLE = ROOT / "examples" / "model_repository" / "simple"
POLL_SECS = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def measure(source: Path, work: Path, reloads: int, every: float, steady: float, pause: float) -> dict[str, str]:
    """One server from checkout ``source`` under the caller and the reloads; the table's cells (ms)."""
    repository = work / "repository"
    shutil.copytree(SIMPLE, repository / "simple")
    http, grpc_port = _free_port(), _free_port()
    log = work / "server.log"
    args = [sys.executable, "-m", "kserve_v2", "serve", f"--model-repository={repository}", f"--http-port={http}",
            f"--grpc-port={grpc_port}", "--allow-metrics=false", "--model-control-mode=poll",
            f"--repository-poll-secs={POLL_SECS:g}"]
    server = subprocess.Popen(args, cwd=source, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(source)})
    try:
        wait_http(server, f"http://127.0.0.1:{http}/v2/health/ready", log, f"server from {source}")
        samples: list[tuple[float, float]] = []  # (start, seconds) per request
        stop = threading.Event()

        def caller() -> None:
            with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
                inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
                client.infer("simple", inputs)  # warm: not counted
                while not stop.is_set():
                    start = time.monotonic()
                    client.infer("simple", inputs)
                    samples.append((start, time.monotonic() - start))
                    time.sleep(pause)

        thread = threading.Thread(target=caller)
        thread.start()
        time.sleep(steady)
        uploads = []
        for version in range(2, reloads + 2):
            staging = repository / "simple" / f".{version}"
            staging.mkdir()
            shutil.copy(SIMPLE / "1" / "model.onnx", staging / "model.onnx")
            uploads.append(time.monotonic())
            staging.rename(repository / "simple" / str(version))
            time.sleep(every)
        stop.set()
        thread.join(timeout=30)
        first = uploads[0]
        before = [seconds for start, seconds in samples if start < first]
        during = [seconds for start, seconds in samples if start >= first]
        windows = [max((s for start, s in samples if upload <= start < upload + 2 * POLL_SECS), default=0.0)
                   for upload in uploads]
        return {"steady": f"{_percentile_ms(before, 50):.1f} / {_percentile_ms(before, 99):.1f} / "
                          f"{max(before, default=0) * 1000:.1f}",
                "reloads": f"{_percentile_ms(during, 50):.1f} / {_percentile_ms(during, 99):.1f} / "
                           f"{max(during, default=0) * 1000:.1f}",
                "windows": " ".join(f"{w * 1000:.0f}" for w in windows),
                "requests": f"{len(before)} + {len(during)}"}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=6, help="new versions written, one after the other")
    parser.add_argument("--every", type=float, default=2.5, help="seconds between two new versions")
    parser.add_argument("--steady", type=float, default=5.0, help="seconds of load before the first new version")
    parser.add_argument("--pause-ms", type=float, default=5.0, help="the caller's pause between two requests")
    parser.add_argument("--source", type=Path, help="also run the server from another checkout (before/after)")
    parser.add_argument("--smoke", action="store_true", help="2 reloads, a 2 s steady phase: checks the harness")
    args = parser.parse_args()
    if args.smoke:
        args.reloads, args.steady = 2, 2.0
    sources = [("ours", ROOT)] + ([(f"ours ({args.source.name})", args.source.resolve())] if args.source else [])
    print("| server | requests steady + reloads | steady p50 / p99 / max ms | reloads p50 / p99 / max ms | "
          "slowest per reload window, ms |")
    print("|---|---|---|---|---|")
    for label, source in sources:
        with tempfile.TemporaryDirectory(prefix="kserve-v2-reload-stall.") as work:
            row = measure(source, Path(work), args.reloads, args.every, args.steady, args.pause_ms / 1000)
        print(f"| {label} | {row['requests']} | {row['steady']} | {row['reloads']} | {row['windows']} |", flush=True)


if __name__ == "__main__":
    main()
