"""Triton 2.51's command line on a real server: the options that have no effect here log one
warning each and the server serves; ``--log-format=ISO8601`` lines are Triton's; ``--log-file``
takes the log; ``--model-config-name`` picks ``configs/<name>.pbtxt``; ``--disable-auto-complete-config``
completes nothing (a configuration without inputs fails to load, as Triton's onnxruntime backend
says, one without a file fails, and a python model's ``auto_complete_config`` is not called); ``--model-load-retry-count`` tries a failing version again.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from helpers import (ROOT, Server, add_model, add_python_model, http_json, infer_input, make_model, start_server,
                     wait_until)

# Triton's qa/L0_logging/log_format_test.py
ISO8601_LINE = re.compile(r"(?P<ISO8601_timestamp>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z) (?P<level>\w+) (?P<pid>\d+) "
                          r"(?P<file>.+):(?P<line>\d+)] (?P<message>.*)")
WARNED = {"--enable-peer-access=true": "enable-peer-access", "--http-thread-count=8": "http-thread-count",
          "--grpc-infer-allocation-pool-size=16": "grpc-infer-allocation-pool-size",
          "--pinned-memory-pool-byte-size=268435456": "pinned-memory-pool-byte-size",
          "--cuda-memory-pool-byte-size=0:67108864": "cuda-memory-pool-byte-size",
          "--buffer-manager-thread-count=2": "buffer-manager-thread-count",
          "--backend-directory=/opt/tritonserver/backends": "backend-directory"}
IO = ('input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] }]\n'
      'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] }]\n')
PYTHON_COMPLETES = '''
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.set_max_batch_size(8)
            return config

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
                request, "INPUT0").as_numpy())]) for request in requests]
'''


def _identity(width: int | None = 4) -> bytes:
    """OUTPUT0 = Identity(INPUT0), FP32 [-1, ``width``] (None: -1)."""
    return make_model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                      [("INPUT0", TensorProto.FLOAT, [None, width])],
                      [("OUTPUT0", TensorProto.FLOAT, [None, width])]).SerializeToString()


def _infer(server: Server, model: str) -> None:
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    with grpcclient.InferenceServerClient(server.url) as client:
        result = client.infer(model, [infer_input(grpcclient, "INPUT0", values, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


class _CountingProxy:
    """A TCP proxy to ``port`` on 127.0.0.1 that counts the bytes the server sends back (one connection)."""

    def __init__(self, port: int) -> None:
        self.received = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._upstream = port
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self._listener.accept()
        server = socket.create_connection(("127.0.0.1", self._upstream))
        threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
        self._pump(server, client, True)

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self.received += len(data) if count else 0
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_warned_options_warn_once_each_and_the_server_serves_in_iso8601(tmp_path: Path) -> None:
    add_model(tmp_path / "models", "identity", _identity(None))
    server = start_server(tmp_path / "models", tmp_path / "logs", *WARNED, "--log-format=ISO8601", "--id=my-triton",
                          "--grpc-infer-response-compression-level=high", "--grpc-max-connection-age=60000",
                          "--grpc-max-connection-age-grace=5000", "--reuse-grpc-port=true", "--reuse-http-port=true")
    try:
        _infer(server, "identity")
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.get_server_metadata().name == "my-triton"  # Triton's --id
        proxy = _CountingProxy(server.port)
        zeros = np.zeros((1, 262144), np.float32)  # 1 MiB that compresses to almost nothing
        with grpcclient.InferenceServerClient(f"127.0.0.1:{proxy.port}") as client:
            result = client.infer("identity", [infer_input(grpcclient, "INPUT0", zeros, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), zeros)
        assert proxy.received < zeros.nbytes // 10  # the response came compressed
    finally:
        assert server.stop() == 0
    lines = server.log().splitlines()
    for name in WARNED.values():
        warned = [line for line in lines if f"--{name} has no effect here: " in line]
        assert len(warned) == 1, (name, warned)
        match = ISO8601_LINE.fullmatch(warned[0])
        assert match is not None and match["level"] == "W", warned[0]
    listening = next(line for line in lines if "gRPC server listening on" in line)
    match = ISO8601_LINE.fullmatch(listening)
    assert match is not None and (match["level"], match["file"]) == ("I", "app.py"), listening


def test_log_file_config_name_and_no_auto_complete(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    picked = add_model(repository, "picked", _identity(), f'backend: "onnxruntime"\n{IO}'
                       'instance_group [{ count: 1, kind: KIND_CPU }]\n')
    (picked / "configs").mkdir()
    (picked / "configs" / "h100.pbtxt").write_text(f'backend: "onnxruntime"\n{IO}'
                                                   'instance_group [{ count: 3, kind: KIND_CPU }]\n')
    add_model(repository, "no_inputs", _identity(), 'backend: "onnxruntime"\n')  # auto-complete would fill them
    add_model(repository, "no_config", _identity())
    add_python_model(repository, "python_completes", IO, PYTHON_COMPLETES)  # its auto_complete_config is not called
    log_file, output = tmp_path / "triton.log", tmp_path / "output.txt"
    with open(output, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository),
             "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-address", "127.0.0.1", "--http-port", "0",
             "--allow-metrics=false", "--exit-on-error=false", f"--log-file={log_file}", "--model-config-name=h100",
             "--disable-auto-complete-config", "--model-load-retry-count=1"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    started = wait_until(lambda: log_file.is_file() and re.search(
        r"gRPC server listening on [^:]+:(\d+)(?s:.*)server is (?:ready|live but not ready)", log_file.read_text()),
        "the server's start in its --log-file")
    server = Server(proc, int(started.group(1)), log_file)
    try:
        _infer(server, "picked")
        with grpcclient.InferenceServerClient(server.url) as client:
            config = client.get_model_config("picked").config
            python_config = client.get_model_config("python_completes").config
            reasons = {m.name: m.reason for m in client.get_model_repository_index().models}
    finally:
        assert server.stop() == 0
    assert [group.count for group in config.instance_group] == [3]  # configs/h100.pbtxt
    assert python_config.max_batch_size == 0 and not python_config.parameters  # as written: nothing completed
    assert "configuration expects 0 inputs, model provides 1" in reasons["no_inputs"]
    assert "the model configuration file 'config.pbtxt' must exist: auto-complete is disabled" in reasons["no_config"]
    log = server.log()
    assert log.count("failed to load 'no_inputs' version 1 (attempt 1 of 2), retrying") == 1
    assert "gRPC server listening on" not in output.read_text()  # the log went to the file


PARAMETERS_ECHO = '''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("PARAMETERS", np.array([r.parameters()], dtype=object))])
                    for r in requests]
'''


def test_header_forward_patterns_make_headers_request_parameters(tmp_path: Path) -> None:
    """--grpc-header-forward-pattern and --http-header-forward-pattern: the headers whose name the pattern finds reach
    the model as string parameters (ModelInfer, ModelStreamInfer's metadata, REST /infer); others do not; a parameter
    the request carries keeps its value."""
    repository = tmp_path / "models"
    add_python_model(repository, "parameters_echo", 'input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }]\n'
                     'output [{ name: "PARAMETERS" data_type: TYPE_STRING dims: [1] }]\n', PARAMETERS_ECHO)
    server = start_server(repository, tmp_path / "logs", "--grpc-header-forward-pattern=^x-",
                          "--http-header-forward-pattern=^x-")
    try:
        given = grpcclient.InferInput("IN", [1], "INT32")
        given.set_data_from_numpy(np.array([1], np.int32))
        with grpcclient.InferenceServerClient(server.url) as client:
            result = client.infer("parameters_echo", [given], headers={"x-user": "alice", "user": "bob"},
                                  parameters={"x-kept": "body"})
            seen = json.loads(result.as_numpy("PARAMETERS")[0])
            assert seen == {"x-user": "alice", "x-kept": "body"}
            answers: queue.SimpleQueue[object] = queue.SimpleQueue()
            client.start_stream(lambda result, error: answers.put(error or result), headers={"x-stream": "s1"})
            client.async_stream_infer("parameters_echo", [given])
            streamed = answers.get(timeout=30)
            client.stop_stream()
            assert json.loads(streamed.as_numpy("PARAMETERS")[0]) == {"x-stream": "s1"}  # type: ignore[union-attr]
        status, body = http_json(server, "/v2/models/parameters_echo/infer",
                                 {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]},
                                 headers={"X-Tenant": "t-7", "Tenant": "no"})
        assert status == 200 and json.loads(body["outputs"][0]["data"][0]) == {"x-tenant": "t-7"}
    finally:
        assert server.stop() == 0
