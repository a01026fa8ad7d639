"""--workers: this server with 1 and 2 replicas beside Triton 2.51 and the do-nothing ceilings with the
same process counts, side by side in one run; then what a second replica costs and what it keeps.

Servers, all started at once on the same box, measured case by case, back to back (the figures of a
row are taken within the same minute):
- ours with ``--workers 1`` and ``--workers 2`` (the example repository, `simple` loaded);
- Triton 2.51 (benchmarks/triton.py, as compare.py runs it);
- the ceilings (benchmarks/ceiling_grpc.py and ceiling_rest.py: parse the request, answer a
  prepared response) with 1 and 2 processes on their ports (``--workers``, ``SO_REUSEPORT``).

Cases, all perf_analyzer on `simple`: REST JSON at concurrency 4 and 16; gRPC at 4 and 16 with
perf_analyzer's channel sharing (one connection for up to 6 contexts) and with one connection per
context (``TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1``, for every server in the row). With one
connection, every request of a context goes to the same replica.

Then, for 1 and 2 workers: cold start (exec to "server is ready") and idle memory one second later,
RSS and PSS summed over the process tree (PSS counts a page shared by the forked replicas once,
divided among them, as the kernel's cgroup accounting counts it once); and the model control storm
of benchmarks/storm.py on 2 workers (loads, unloads and infers in parallel: wrong answers, and
whether every replica ends with the same models).

Usage: python benchmarks/workers.py [--seconds 5] [--smoke] [--skip-triton] [--case TEXT ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton  # noqa: E402 - sibling module
from compare import EXAMPLES, ratio, start_ceiling, start_triton  # noqa: E402 - the sibling benchmark's helpers
from perf import perf_analyzer, run, start_server  # noqa: E402
from storm import control_storm, repository  # noqa: E402

SHARE_ENV = "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"
SERVERS = ("ours w2", "ours w1", "Triton", "ceiling w2", "ceiling w1")


@dataclass(frozen=True)
class Case:
    label: str
    protocol: str  # grpc | http
    concurrency: int
    connection_per_context: bool = False


CASES = (
    Case("http simple json c=4", "http", 4),
    Case("http simple json c=16", "http", 16),
    Case("grpc simple c=4, shared channel", "grpc", 4),
    Case("grpc simple c=16, shared channel", "grpc", 16),
    Case("grpc simple c=4, connection per context", "grpc", 4, True),
    Case("grpc simple c=16, connection per context", "grpc", 16, True),
)


def measure(tool: str, case: Case, ports: dict[str, int], seconds: float, work: Path) -> dict[str, float] | str:
    env = {**os.environ, **({SHARE_ENV: "1"} if case.connection_per_context else {})}
    try:
        return run(tool, ports, "simple", case.concurrency, seconds, None, work, case.protocol,
                   "json" if case.protocol == "http" else None, stability=999, env=env)
    except subprocess.CalledProcessError as err:
        return f"fails: perf_analyzer exit {err.returncode}"


def _ours(work: Path, workers: int) -> tuple[list[subprocess.Popen], dict[str, int]]:
    proc, ports = start_server(EXAMPLES, work / f"ours-{workers}.log", "--model-control-mode", "explicit",
                               "--load-model", "simple", "--workers", str(workers))
    return [proc], ports


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    found = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == pid:
                found += _tree(int(entry.name))
    return found


def _rollup(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process in MiB (/proc/<pid>/smaps_rollup)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return fields["Rss"] / 1024, fields["Pss"] / 1024


def footprint(work: Path, workers: int) -> dict[str, float]:
    """Seconds from exec to ready on the example repository, and RSS and PSS (MiB) summed over the
    process tree one second later."""
    began = time.perf_counter()
    proc, _ = start_server(EXAMPLES, work / f"cold-{workers}.log", "--workers", str(workers))
    ready = time.perf_counter() - began
    time.sleep(1)
    rss = pss = 0.0
    pids = _tree(proc.pid)
    for pid in pids:
        one_rss, one_pss = _rollup(pid)
        rss, pss = rss + one_rss, pss + one_pss
    proc.terminate()
    proc.wait(60)
    return {"ready s": ready, "RSS MiB": rss, "PSS MiB": pss, "processes": len(pids)}


def storm(work: Path, seconds: float) -> str:
    work.mkdir()
    repo = repository(work)
    proc, ports = start_server(repo, work / "storm.log", "--model-control-mode", "explicit", "--load-model", "*",
                               "--workers", "2")
    try:
        return control_storm(ports, seconds)
    finally:
        proc.terminate()
        proc.wait(60)


def _cell(value: dict[str, float] | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value['infer/s']:,.0f} infer/s ({value['p50 ms']:.2f} / {value['p99 ms']:.2f})"



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5, help="measurement window")
    parser.add_argument("--smoke", action="store_true", help="short windows: checks the harness, not the speed")
    parser.add_argument("--skip-triton", action="store_true", help="leave Triton out")
    parser.add_argument("--triton-if-cached", action="store_true",
                        help="run Triton only when its environment is already in the cache (no download)")
    parser.add_argument("--case", action="append", default=[], help="only the cases whose label contains this text")
    args = parser.parse_args()
    cases = [case for case in CASES if not args.case or any(text in case.label for text in args.case)]
    seconds = 0.5 if args.smoke else args.seconds
    tool = perf_analyzer()
    triton_env = None if args.skip_triton else triton.environment(create=not args.triton_if_cached)
    figures: dict[tuple[str, str], dict[str, float] | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        starts = {"ours w2": lambda: _ours(work, 2), "ours w1": lambda: _ours(work, 1),
                  "ceiling w2": lambda: start_ceiling(work, 2), "ceiling w1": lambda: start_ceiling(work, 1)}
        if triton_env is not None:
            starts["Triton"] = lambda: start_triton(triton_env, work)
        running: dict[str, tuple[list[subprocess.Popen], dict[str, int]]] = {}
        try:
            for server, launch in starts.items():
                running[server] = launch()
            for case in cases:
                for server in SERVERS:
                    if server in running:
                        figures[(server, case.label)] = measure(tool, case, running[server][1], seconds, work)
        finally:
            for procs, _ in running.values():
                for proc in procs:
                    proc.terminate()
            for procs, _ in running.values():
                for proc in procs:
                    proc.wait(60)
        costs = {workers: footprint(work, workers) for workers in (1, 2)}
        stormed = storm(work / "storm", 2 if args.smoke else 10)
    print("perf_analyzer on `simple`. Cells: throughput (p50 / p99 ms). w1, w2: 1 and 2 worker processes.")
    print(f"| case | {' | '.join(SERVERS)} | ours w2 / Triton | ours w1 / Triton | ours w2 / ours w1 "
          "| ours w2 / ceiling w2 |")
    print("|---" * (len(SERVERS) + 5) + "|")
    for case in cases:
        row = {server: figures.get((server, case.label)) for server in SERVERS}
        print(f"| {case.label} | {' | '.join(_cell(row[s]) for s in SERVERS)} | {ratio(row['ours w2'], row['Triton'])} "
              f"| {ratio(row['ours w1'], row['Triton'])} | {ratio(row['ours w2'], row['ours w1'])} "
              f"| {ratio(row['ours w2'], row['ceiling w2'])} |")
    print("\n| workers | cold start to ready | processes | idle RSS, summed | idle PSS, summed |\n|---|---|---|---|---|")
    for workers, cost in costs.items():
        print(f"| {workers} | {cost['ready s']:.2f} s | {cost['processes']:.0f} | {cost['RSS MiB']:.0f} MiB "
              f"| {cost['PSS MiB']:.0f} MiB |")
    print(f"\n2 workers / 1: RSS {costs[2]['RSS MiB'] / costs[1]['RSS MiB']:.2f}x, "
          f"PSS {costs[2]['PSS MiB'] / costs[1]['PSS MiB']:.2f}x")
    print(f"\nmodel control storm on 2 workers: {stormed}")


if __name__ == "__main__":
    main()
