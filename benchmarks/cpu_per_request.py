"""Server CPU time per request under perf_analyzer load: steadier than throughput on a shared machine.

For each case (protocol x model x concurrency) and server, perf_analyzer drives the model (`simple`;
``--models simple simple_python`` adds the same sums in a python model, run in the server's process;
the ceiling servers answer `simple` for both, the same protocol work); after a warm-up,
the CPU time of every thread of the server process (``/proc/<pid>/task/*/stat``: user + system)
and the number of requests it answered (its own ModelStatistics success count; the ceiling servers
count what they answer) are read twice, ``--seconds`` apart. CPU per request = CPU time / requests,
split into the event loop's thread (the process's main thread) and all other threads (gRPC's
poller and event engine, ONNX Runtime). Rounds alternate between the servers so that the load of
other processes on the machine spreads over all of them; the table shows the median of the rounds.

``--source DIR`` adds this server as run from another checkout (``git worktree add /tmp/before
main``), to compare before and after a change in one sitting.

Usage: python benchmarks/cpu_per_request.py [--servers ours ceiling] [--protocols grpc http]
       [--models simple simple_python] [--concurrency 4 16] [--rounds 3] [--seconds 5] [--source DIR]

``make bench-smoke`` runs one short round of gRPC and REST `simple` and gRPC `simple_python` (c=4),
ours beside the ceiling, and prints the ratio: what each change to the request path costs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples" / "model_repository"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from perf import perf_analyzer  # noqa: E402 - sibling module
from processes import wait_http  # noqa: E402 - sibling module

from kserve_v2._proto import grpc_service_pb2 as pb  # noqa: E402
from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
WARM_UP_S = 2.5


@dataclass
class Server:
    """A running server: its label, process and ports."""

    label: str
    proc: subprocess.Popen
    ports: dict[str, int]


@dataclass
class Sample:
    """CPU seconds of the main thread and of the others, and requests answered, at one moment."""

    main_s: float
    other_s: float
    answered: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ours(label: str, source: Path, work: Path, models: list[str]) -> Server:
    """This server (from ``source``, a checkout) on free ports, ``models`` loaded."""
    ports = {"grpc": _free_port(), "http": _free_port()}
    log = work / f"{label}.log"
    proc = subprocess.Popen([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(EXAMPLES),
                             "--grpc-address", "127.0.0.1", "--grpc-port", str(ports["grpc"]), "--http-address",
                             "127.0.0.1", "--http-port", str(ports["http"]), "--metrics-port", "0",
                             "--model-control-mode", "explicit", *(a for m in models for a in ("--load-model", m))],
                            cwd=source, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(source)})
    wait_http(proc, f"http://127.0.0.1:{ports['http']}/v2/models/simple/ready", log, label)
    return Server(label, proc, ports)


def start_ceiling(protocol: str, work: Path) -> Server:
    """The ceiling server of ``protocol`` (``ceiling_grpc.py`` or ``ceiling_rest.py``)."""
    port = _free_port()
    log = work / f"ceiling-{protocol}.log"
    script = HERE / ("ceiling_grpc.py" if protocol == "grpc" else "ceiling_rest.py")
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port), "--repository", str(EXAMPLES)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])})
    if protocol == "http":
        wait_http(proc, f"http://127.0.0.1:{port}/v2/health/ready", log, "ceiling REST")
    else:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=120)
    return Server(f"ceiling {protocol}", proc, {protocol: port})


def answered(server: Server, protocol: str, model: str) -> int:
    """The server's count of successful requests of ``model`` (ModelStatistics)."""
    if protocol == "grpc":
        with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(pb.ModelStatisticsRequest(name=model))
        return reply.model_stats[0].inference_stats.success.count
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['http']}/v2/models/{model}/stats", timeout=10) as r:
        return int(json.load(r)["model_stats"][0]["inference_stats"]["success"]["count"])


def sample(server: Server, protocol: str, model: str) -> Sample:
    """CPU seconds by thread group now, and the requests answered."""
    main = other = 0.0
    pid = server.proc.pid
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended meanwhile
        seconds = (int(fields[11]) + int(fields[12])) / TICKS
        if task.name == str(pid):
            main += seconds
        else:
            other += seconds
    return Sample(main, other, answered(server, protocol, model))


def measure(tool: str, server: Server, protocol: str, model: str, concurrency: int, seconds: float
            ) -> tuple[float, float, float]:
    """One round: (main thread us, other threads us) per request, and requests per second."""
    model = model if server.label.startswith("ours") else "simple"  # the ceiling's answer is simple's
    load = subprocess.Popen([tool, "-m", model, "-i", protocol, "-u", f"127.0.0.1:{server.ports[protocol]}",
                             "--concurrency-range", str(concurrency), "--measurement-interval", "1000",
                             "--stability-percentage", "999", "--max-trials", "100000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(WARM_UP_S)
        before, started = sample(server, protocol, model), time.monotonic()
        time.sleep(seconds)
        after, elapsed = sample(server, protocol, model), time.monotonic() - started
    finally:
        load.send_signal(signal.SIGINT)
        try:
            load.wait(30)
        except subprocess.TimeoutExpired:
            load.kill()
            load.wait()
    count = max(after.answered - before.answered, 1)
    return ((after.main_s - before.main_s) / count * 1e6, (after.other_s - before.other_s) / count * 1e6,
            count / elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", default=["ours", "ceiling"], choices=["ours", "ceiling"])
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--models", nargs="+", default=["simple"], choices=["simple", "simple_python"],
                        help="simple_python runs over gRPC only")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round")
    parser.add_argument("--source", type=Path, help="also run this server from another checkout (before/after)")
    args = parser.parse_args()
    tool = perf_analyzer()
    with tempfile.TemporaryDirectory(prefix="cpu-per-request-") as folder:
        work = Path(folder)
        servers: dict[str, list[Server]] = {protocol: [] for protocol in args.protocols}
        try:
            if "ours" in args.servers:
                ours = [start_ours("ours", ROOT, work, args.models)]
                if args.source is not None:
                    ours.append(start_ours(f"ours ({args.source.name})", args.source.resolve(), work, args.models))
                for protocol in args.protocols:
                    servers[protocol] += ours
            if "ceiling" in args.servers:
                for protocol in args.protocols:
                    servers[protocol].append(start_ceiling(protocol, work))
            print("| case | server | CPU us / request | event loop thread | other threads | requests/s | ours / ceiling |")
            print("|---|---|---|---|---|---|---|")
            cases = [(p, m) for p in args.protocols for m in args.models if p == "grpc" or m == "simple"]
            for protocol, model in cases:
                for concurrency in args.concurrency:
                    rounds: dict[str, list[tuple[float, float, float]]] = {s.label: [] for s in servers[protocol]}
                    for _ in range(args.rounds):
                        for server in servers[protocol]:
                            rounds[server.label].append(measure(tool, server, protocol, model, concurrency,
                                                                args.seconds))
                    totals = {label: statistics.median(m + o for m, o, _ in values) for label, values in rounds.items()}
                    ceiling = next((t for label, t in totals.items() if label.startswith("ceiling")), None)
                    for label, values in rounds.items():
                        main_us, other_us, rate = (statistics.median(v) for v in zip(*values, strict=True))
                        each = sorted(round(m + o) for m, o, _ in values)
                        ratio = f"{totals[label] / ceiling:.2f}" if ceiling and not label.startswith("ceiling") else ""
                        print(f"| {protocol} {model} c={concurrency} | {label} | {totals[label]:.0f} "
                              f"(rounds: {', '.join(map(str, each))}) | {main_us:.0f} | {other_us:.0f} | {rate:,.0f} "
                              f"| {ratio} |", flush=True)
        finally:
            for server in {id(s): s for group in servers.values() for s in group}.values():
                server.proc.terminate()
                server.proc.wait(60)


if __name__ == "__main__":
    main()
