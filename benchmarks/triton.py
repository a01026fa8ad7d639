"""Triton Inference Server 2.51 for benchmarks/compare.py: the tritonserver bundled in PyPI's
``nvidia-pytriton==0.7.0`` wheel, serving the example ONNX models through the python backend, and the example python model
``simple_python`` unchanged.

The environment (``triton-2.51`` in the user's cache folder, see benchmarks/cache.py) holds the
wheel plus numpy and onnxruntime; it is created on first use and never inside the tree. Facts
about the wheel: the binary is ``pytriton/tritonserver/bin/tritonserver``; it needs
``LD_LIBRARY_PATH`` on the wheel's ``nvidia_pytriton.libs``; the python backend's stub for this
Python is under ``pytriton/tritonserver/python_backend_stubs/<major.minor>/`` and must sit beside
the backend's files, so a backend folder is assembled in the run's work folder; the stub embeds
libpython in an isolated configuration and finds numpy and onnxruntime only through the
``python3`` first on its ``PATH``, so the environment's ``bin`` goes first there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from cache import cache_dir  # sibling module
from processes import wait_http  # sibling module

PACKAGES = ["nvidia-pytriton==0.7.0", "onnxruntime", "numpy"]
HERE = Path(__file__).resolve().parent


def environment(create: bool = True) -> Path | None:
    """The environment's folder, installing it the first time (None when absent and ``create`` is false)."""
    env = cache_dir("triton-2.51")
    if not (env / ".complete").exists():
        if not create:
            return None
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", *PACKAGES], check=True)
        (env / ".complete").write_text("")
    return env


def _site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3*/site-packages"))


def repository(examples: Path, target: Path, models: tuple[str, ...] = ("simple", "identity_fp32", "simple_python")) -> Path:
    """Triton's repository: each example ONNX model's config with the python backend and model.py running
    its .onnx; an example python model (``simple_python``) as it is, the same model.py ours runs."""
    for name in models:
        if 'backend: "python"' in (examples / name / "config.pbtxt").read_text():
            shutil.copytree(examples / name, target / name)
            continue
        (target / name / "1").mkdir(parents=True)
        shutil.copy(HERE / "triton_model.py", target / name / "1" / "model.py")
        config = (examples / name / "config.pbtxt").read_text().replace('platform: "onnxruntime_onnx"', 'backend: "python"')
        onnx = (examples / name / "1" / "model.onnx").resolve()
        config += (f'parameters: {{ key: "onnx_path" value: {{ string_value: "{onnx}" }} }}\n'
                   "instance_group [ { kind: KIND_CPU, count: 1 } ]\ndynamic_batching { }\n")
        (target / name / "config.pbtxt").write_text(config)
    return target


def _backends(env: Path, target: Path) -> Path:
    """A backend folder: the wheel's python backend with this Python's stub copied beside it."""
    tritonserver = _site_packages(env) / "pytriton" / "tritonserver"
    shutil.copytree(tritonserver / "backends", target, symlinks=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy(tritonserver / "python_backend_stubs" / version / "triton_python_backend_stub", target / "python")
    return target


def start(env: Path, examples: Path, work: Path, ports: dict[str, int], log: Path) -> subprocess.Popen:
    """Start tritonserver on ``ports`` (grpc, http, metrics) and wait until its models are ready.

    Raises:
        SystemExit: it did not become ready (the log's tail is shown).
    """
    site = _site_packages(env)
    binary = site / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    environ = {**os.environ, "PATH": f"{env / 'bin'}:{os.environ.get('PATH', '')}",
               "LD_LIBRARY_PATH": f"{site / 'nvidia_pytriton.libs'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    command = [str(binary), "--model-repository", str(repository(examples, work / "triton-models")),
               "--backend-directory", str(_backends(env, work / "triton-backends")),
               "--grpc-address", "127.0.0.1", "--grpc-port", str(ports["grpc"]),
               "--http-address", "127.0.0.1", "--http-port", str(ports["http"]),
               "--metrics-port", str(ports["metrics"]), "--allow-metrics", "false", "--log-verbose", "0"]
    proc = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=environ)
    wait_http(proc, f"http://127.0.0.1:{ports['http']}/v2/health/ready", log, "Triton")
    return proc
