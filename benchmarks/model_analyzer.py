"""Triton's Model Analyzer against this server: the sizing tool Triton users run, unmodified.

Model Analyzer (``triton-model-analyzer`` on PyPI) launches ``tritonserver`` itself in its ``local``
launch mode, with Triton's command line (``--model-repository``, ``--model-control-mode=explicit``,
``--strict-model-config=false``, its ports), writes one model configuration per candidate
(instance counts, ``max_batch_size``, dynamic batching) into an output repository, loads each
through the repository API, drives it with ``perf_analyzer`` over a concurrency sweep and reads
``/metrics``. Here ``--triton-server-path`` names a two-line ``tritonserver`` that starts this
server with the same arguments (``kserve-v2 serve "$@"``). Model Analyzer gets its own
environment (it pins its own tritonclient and protobuf), made once under the cache folder.

Prints Model Analyzer's inference table (model, batch, concurrency, configuration, instance group,
max batch size, throughput, p99 latency) and exits with its status. No GPU: it warns that the GPU
fields have no data, as it does for any CPU-only Triton.

Usage: python benchmarks/model_analyzer.py [--model simple] [--work DIR] [--max-instances 2]
       [--max-concurrency 4] [--max-batch-size 8]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from perf import perf_analyzer  # noqa: E402 - sibling module

VERSION = "1.58.0"  # triton-model-analyzer, the release this was run with (2026-12-07)
CACHE = Path.home() / ".cache" / "kserve_v2" / f"model-analyzer-{VERSION}"


def environment() -> Path:
    """Model Analyzer's own virtual environment (made once): its ``model-analyzer`` command."""
    command = CACHE / "bin" / "model-analyzer"
    if not command.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CACHE)], check=True)
        subprocess.run([str(CACHE / "bin" / "pip"), "install", "-q", f"triton-model-analyzer=={VERSION}"], check=True)
    return command


def main() -> int:
    """Profile one example model with Model Analyzer, this server standing in for ``tritonserver``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="simple", help="a model of examples/model_repository")
    parser.add_argument("--work", type=Path, help="where the repositories, checkpoints and reports go (default: a temp dir)")
    parser.add_argument("--max-instances", type=int, default=2)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--max-batch-size", type=int, default=8)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="model-analyzer-"))
    repository = work / "repo"
    shutil.rmtree(repository, ignore_errors=True)
    shutil.copytree(ROOT / "examples" / "model_repository" / args.model, repository / args.model)
    server = work / "tritonserver"
    server.write_text(f'#!/bin/sh\nexec "{Path(sys.executable).parent / "kserve-v2"}" serve "$@"\n')
    server.chmod(0o755)
    done = subprocess.run([
        str(environment()), "profile", "--model-repository", str(repository), "--profile-models", args.model,
        "--triton-launch-mode", "local", "--triton-server-path", str(server), "--perf-analyzer-path", perf_analyzer(),
        "--output-model-repository-path", str(work / "out"), "--override-output-model-repository",
        "--checkpoint-directory", str(work / "checkpoints"), "--export-path", str(work),
        "--triton-output-path", str(work / "server.log"),
        "--run-config-search-max-instance-count", str(args.max_instances),
        "--run-config-search-max-concurrency", str(args.max_concurrency),
        "--run-config-search-max-model-batch-size", str(args.max_batch_size)], cwd=work)
    table = work / "results" / "metrics-model-inference.csv"
    if table.exists():
        print(table.read_text())
    print(f"reports: {work / 'reports'}; the server's log: {work / 'server.log'}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
