"""How /metrics can total the replicas of --workers: prometheus-client's multiprocess mode against
merging each replica's registry (what the server does), measured.

- CPU per request of recording one `simple` success: ``InferenceMetrics`` (plain numbers, folded at
  scrape time), against the same families as prometheus-client metric objects, in memory and in
  its multiprocess mode (values in memory-mapped files under ``PROMETHEUS_MULTIPROC_DIR``, which is
  what the replicas would have to share), each in its own process, label children looked up once;
- the time of a scrape of the metrics port after 200 REST requests, with 1 and 2 workers (the
  merge gathers every replica's registry through the supervisor).

Usage: python benchmarks/metrics_modes.py [--requests 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from perf import ROOT, start_server

LABELS = ["model", "version"]


def record(mode: str, requests: int) -> float:
    """µs of CPU to record one request's metrics in ``mode`` (``ours``, ``in-memory``, ``multiprocess``)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()
    if mode == "ours":
        from kserve_v2.observability.metrics import InferenceMetrics
        from kserve_v2.protocol.statistics import RequestReport

        metrics = InferenceMetrics(registry)
        report = RequestReport(1, 1, 1, 100_000, 1_000, 2_000, 3_000, 4_000)
        began = time.process_time()
        for _ in range(requests):
            metrics.started("simple", "1")
            metrics.succeeded("simple", "1", "infer", report)
        metrics.fold()
        return (time.process_time() - began) / requests * 1e6
    # Triton's eight counting families, the pending gauge and latency histogram, SIE's per-API families
    counters = [Counter(f"c{i}", "c", LABELS, registry=registry).labels("simple", "1") for i in range(8)]
    pending = Gauge("pending", "p", LABELS, registry=registry, multiprocess_mode="livesum").labels("simple", "1")
    latency = Histogram("latency", "l", LABELS, registry=registry).labels("simple", "1")
    api = Counter("api", "a", ["model", "api", "status"], registry=registry).labels("simple", "infer", "ok")
    phases = [Histogram(f"phase{i}", "p", ["model", "api"], registry=registry).labels("simple", "infer") for i in range(5)]
    batch = Histogram("batch", "b", ["model"], registry=registry).labels("simple")
    began = time.process_time()
    for _ in range(requests):
        pending.inc()
        for counter in counters:
            counter.inc()
        pending.dec()
        latency.observe(0.0001)
        api.inc()
        for phase in phases:
            phase.observe(0.00001)
        batch.observe(1)
    return (time.process_time() - began) / requests * 1e6


def scrape_ms(workers: int, work: Path) -> float:
    """Median ms of 100 scrapes of the metrics port after 200 REST requests."""
    proc, ports = start_server(ROOT / "examples" / "model_repository", work / f"scrape-{workers}.log",
                               "--workers", str(workers), "--metrics-address", "127.0.0.1")
    try:
        text = (work / f"scrape-{workers}.log").read_text()
        metrics_port = int(text.split("metrics server listening on ")[1].split()[0].rsplit(":", 1)[1])
        body = json.dumps({"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()
        for _ in range(200):
            request = urllib.request.Request(f"http://127.0.0.1:{ports['http']}/v2/models/simple/infer", data=body)
            urllib.request.urlopen(request, timeout=30).read()
        times = []
        for _ in range(100):
            began = time.perf_counter()
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(record(args.mode, args.requests))
        return
    print("| recording one request's metrics | CPU µs / request |\n|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("ours", "in-memory", "multiprocess"):
            env = {**os.environ, **({"PROMETHEUS_MULTIPROC_DIR": tmp} if mode == "multiprocess" else {})}
            done = subprocess.run([sys.executable, __file__, "--mode", mode, "--requests", str(args.requests)],
                                  env=env, capture_output=True, text=True, check=True)
            print(f"| {mode} | {float(done.stdout):.1f} |")
        work = Path(tmp) / "servers"
        work.mkdir()
        print("\n| workers | /metrics scrape, median ms |\n|---|---|")
        for workers in (1, 2):
            print(f"| {workers} | {scrape_ms(workers, work):.1f} |")


if __name__ == "__main__":
    main()
