"""Test helpers: a real server subprocess and ONNX models built with onnx.helper.

Tests import tritonclient; the server's own generated ``inference.*`` modules live only in the
server process (both register the same protobuf symbols).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
SHARED_MODELS = ROOT.parent / "shared" / "models"
# sentence-transformers' example sentences and the MiniLM cosines (first vs the others) that
# ../shared/models/README.md gives as ONNX Runtime CPU reference values
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "A cheetah is running behind its prey."]
REFERENCE = {"all-MiniLM-L6-v2": (0.7553, 0.1419), "all-MiniLM-L6-v2-int8": (0.7535, 0.1371)}
_LISTENING = re.compile(r"gRPC server listening on [^:]+:(\d+)")
_HTTP_LISTENING = re.compile(r"HTTP server listening on [^:]+:(\d+)")
_METRICS_LISTENING = re.compile(r"metrics server listening on [^:\"]+:(\d+)")
_STARTED = ("server is ready", "server is live but not ready")



def cosines(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors[1:] @ vectors[0]

@dataclass
class Server:
    """A running ``kserve-v2 serve`` process."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    http_port: int = 0
    metrics_port: int = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def start_server(repository: Path, log_dir: Path, *args: str, timeout: float = 60, wait_startup: bool = True) -> Server:
    """Start the server on a free port; wait until its port is open and (by default) startup loading has ended."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
             "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-address", "127.0.0.1", "--http-port", "0",
             "--metrics-address", "127.0.0.1", "--metrics-port", "0", *args],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text()
        match = _LISTENING.search(text)
        http = _HTTP_LISTENING.search(text)
        metrics = _METRICS_LISTENING.search(text)
        if match and (not wait_startup or any(marker in text for marker in _STARTED)):
            return Server(proc, int(match.group(1)), log_path, int(http.group(1)) if http else 0,
                          int(metrics.group(1)) if metrics else 0)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not start in {timeout} s:\n{log_path.read_text()}")


def make_model(nodes: list, inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int, list]]) -> onnx.ModelProto:
    """An ONNX model (opset 21) from nodes and (name, TensorProto type, shape) value infos."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


# every V2 datatype and the ONNX element type that carries it
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING, "BF16": TensorProto.BFLOAT16,
}


def sample(datatype: str) -> np.ndarray:
    """A [2, 3] array exercising the type's range (as tritonclient wants it for that datatype)."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        return np.array([[b"a\x00b", b"", b"xyz"], [b"\x00", "é".encode(), b"end"]], dtype=np.object_)
    if datatype == "BF16":
        return np.array([[1.5, -2.0, 0.0], [3.25, 1024.0, -0.5]], dtype=ml_dtypes.bfloat16)  # tritonclient >= 2.70
    dtype = np.dtype({"FP16": "float16", "FP32": "float32", "FP64": "float64"}.get(datatype, datatype.lower()))
    if dtype.kind == "f":
        return np.array([[1.5, -2.25, 0.0], [np.finfo(dtype).max, np.finfo(dtype).tiny, -7.0]], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, 0, info.max], [1, info.max - 1, info.min + 1]], dtype=dtype)


def identity_model(onnx_type: int, shape: list | None = None) -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0 identity, default shape [batch, n] with both dims dynamic."""
    shape = [None, None] if shape is None else shape
    return make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                      [("INPUT0", onnx_type, shape)], [("OUTPUT0", onnx_type, shape)])


def slow_loading_model(nodes: int = 2000) -> onnx.ModelProto:
    """A chain of ``nodes`` Adds on FP32 [batch, 4]: ONNX Runtime takes seconds to optimise it."""
    chain = [helper.make_node("Add", ["INPUT0" if i == 0 else f"t{i - 1}", "INPUT0"],
                              ["OUTPUT0" if i == nodes - 1 else f"t{i}"]) for i in range(nodes)]
    return make_model(chain, [("INPUT0", TensorProto.FLOAT, [None, 4])], [("OUTPUT0", TensorProto.FLOAT, [None, 4])])


def matmul_model(size: int, depth: int = 1) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 @ W @ W ... (``depth`` times) with a constant [size, size] FP32 W of 1/size.

    Rows of ones stay ones, and each row costs 2 * size^2 * depth flops: slow enough to be in flight.
    """
    weight = helper.make_tensor("W", TensorProto.FLOAT, [size, size], [1.0 / size] * (size * size))
    names = ["INPUT0"] + [f"h{i}" for i in range(1, depth)] + ["OUTPUT0"]
    graph = helper.make_graph(
        [helper.make_node("MatMul", [names[i], "W"], [names[i + 1]]) for i in range(depth)], "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, size])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, size])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def add_model(repository: Path, name: str, model: onnx.ModelProto | bytes, config: str | None = None,
              versions: tuple[int, ...] = (1,)) -> Path:
    """Write ``<repository>/<name>/<v>/model.onnx`` for each version, and config.pbtxt when given."""
    folder = repository / name
    for version in versions:
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        data = model if isinstance(model, bytes) else model.SerializeToString()
        (folder / str(version) / "model.onnx").write_bytes(data)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    return folder
