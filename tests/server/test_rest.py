"""REST on the V2 HTTP protocol: tritonclient.http, plain HTTP, the protocol's example, limits."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import EXAMPLES, Server, add_model, http_request, identity_model, make_model, start_server

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 2, dtype=np.int32)


def http(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, body) of one plain HTTP request (``http_request``: only the headers given)."""
    reply = http_request(server, path, content=body, method=method, headers=headers, timeout=30)
    return reply.status_code, reply.headers, reply.content


def http_early_reply(server, path: str, body: bytes, headers: dict) -> int:
    """Status of a request the server may answer before reading the whole body (a too large one)."""
    import socket

    head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": len(body), "Connection": "close"}.items())
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\n{head}\r\n".encode() + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the body was sent: read that answer
        return int(sock.recv(64).split()[1])


@pytest.fixture
def hclient(example_server):
    client = httpclient.InferenceServerClient(example_server.http_url)
    yield client
    client.close()


def _inputs(a=A, b=B, binary0=False, binary1=True):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"), httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary0)
    inputs[1].set_data_from_numpy(b, binary_data=binary1)
    return inputs


def test_health_metadata_config_stats_index(hclient, example_server) -> None:
    assert hclient.is_server_live() and hclient.is_server_ready()
    assert hclient.is_model_ready("simple") and not hclient.is_model_ready("no_such_model")
    assert hclient.get_server_metadata()["name"] == "kserve_v2"
    metadata = hclient.get_model_metadata("simple")
    assert metadata["versions"] == ["1"] and metadata["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    config = hclient.get_model_config("simple")
    assert config["max_batch_size"] == 8 and config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["input"][0]["dims"] == [16] and config["input"][0]["format"] == "FORMAT_NONE"
    assert config["version_policy"]["latest"]["num_versions"] == 1
    hclient.infer("simple", _inputs())
    stats = hclient.get_inference_statistics("simple")["model_stats"]
    assert len(stats) == 1 and stats[0]["inference_count"] >= 1 and isinstance(stats[0]["inference_stats"]["success"]["ns"], int)
    assert len(hclient.get_inference_statistics()["model_stats"]) >= 5
    index = hclient.get_model_repository_index()
    assert {"name": "simple", "version": "1", "state": "READY"} in index
    # KServe's REST client reads these JSON bodies
    for path, expected in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True}),
                           ("/v2/models/simple/ready", {"name": "simple", "ready": True}), ("/", {"live": True})):
        status, _, body = http(example_server, "GET", path)
        assert status == 200 and json.loads(body) == expected
    status, _, body = http(example_server, "GET", "/v2/models/no_such_model/ready")
    assert status == 400 and json.loads(body) == {"name": "no_such_model", "ready": False}


def test_infer_mixed_json_and_binary_with_compression(hclient) -> None:
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    for request_c, response_c in ((None, None), ("gzip", "gzip"), ("deflate", "deflate"), ("gzip", "deflate")):
        result = hclient.infer("simple", _inputs(), outputs=outputs, request_id="7", query_params={"test_1": 1},
                               headers={"x-test": "1"}, request_compression_algorithm=request_c,
                               response_compression_algorithm=response_c)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        response = result.get_response()
        assert response["id"] == "7"
        assert response["outputs"][0]["parameters"]["binary_data_size"] == 64
        assert response["outputs"][1]["data"] == (A - B).reshape(-1).tolist()
    all_json = hclient.infer("simple", _inputs(binary1=False), outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    np.testing.assert_array_equal(all_json.as_numpy("OUTPUT0"), A + B)
    omitted = hclient.infer("simple", _inputs())  # outputs=None: every output, binary
    assert [o["name"] for o in omitted.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_bytes_with_nul_over_binary_and_json(hclient) -> None:
    data = np.array([[b"he\x00llo", b"\x00\x01\x02\x03", "é".encode()]], dtype=np.object_)
    for binary in (True, False):
        tensor = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
        tensor.set_data_from_numpy(data, binary_data=binary)
        out = hclient.infer("simple_identity", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
        got = out.as_numpy("OUTPUT0")
        assert [x if isinstance(x, bytes) else x.encode() for x in got.reshape(-1)] == list(data.reshape(-1)), binary


def test_aio_client(example_server) -> None:
    async def run() -> None:
        client = aiohttpclient.InferenceServerClient(example_server.http_url)
        try:
            assert await client.is_server_ready()
            inputs = [aiohttpclient.InferInput("INPUT0", [1, 16], "INT32"), aiohttpclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(A)
            inputs[1].set_data_from_numpy(B)
            results = await asyncio.gather(*(client.infer("simple", inputs) for _ in range(4)))
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        finally:
            await client.close()

    asyncio.run(run())


def test_raw_binary_request(example_server) -> None:
    data = np.arange(8, dtype=np.float32)
    status, headers, body = http(example_server, "POST", "/v2/models/identity_fp32/infer", data.tobytes(),
                                 {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    length = int(headers["inference-header-content-length"])
    header = json.loads(body[:length])
    assert header["outputs"][0]["shape"] == [1, 8]
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32), data)


@pytest.fixture(scope="module")
def own_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (no flags) on the models of the raw binary and the protocol document tests, each
    test using only its own models."""
    repository = tmp_path_factory.mktemp("repo")
    _raw_binary_models(repository)
    _document_model(repository)
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def _raw_binary_models(repository: Path) -> None:
    add_model(repository, "zero_1_float32", identity_model(TensorProto.FLOAT, [None, None]),
              'max_batch_size: 8\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]')
    add_model(repository, "unbatched_float32", identity_model(TensorProto.FLOAT, [2, None]), "max_batch_size: 0")
    add_model(repository, "zero_1_object_1_element", identity_model(TensorProto.STRING, [None, 1]),
              "max_batch_size: 8")
    add_model(repository, "zero_1_object", identity_model(TensorProto.STRING, [None, None]), "max_batch_size: 8")
    add_model(repository, "zero_1_float16", identity_model(TensorProto.FLOAT16, [None, None, None]),
              'max_batch_size: 8\ninput [{ name: "INPUT0" data_type: TYPE_FP16 dims: [-1, -1] }]')
    nodes = [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in range(3)]
    add_model(repository, "zero_3_float32", make_model(
        nodes, [(f"INPUT{i}", TensorProto.FLOAT, [None, None]) for i in range(3)],
        [(f"OUTPUT{i}", TensorProto.FLOAT, [None, None]) for i in range(3)]), "max_batch_size: 8")


def test_raw_binary_requests_as_triton_deduces_them(own_models: Server) -> None:
    """L0_http http_test.py: a raw binary body is the one input's data, its shape deduced from the config
    (batch 1 when batching, the one variable dim from the body); a BYTES input of one element takes the
    whole body; what cannot be deduced answers 400 with Triton's texts."""
    raw = {"Inference-Header-Content-Length": "0"}

    def post(model: str, body: bytes) -> tuple[int, dict, bytes]:
        status, headers, reply = http(own_models, "POST", f"/v2/models/{model}/infer", body, raw)
        if status != 200:
            return status, {}, json.loads(reply)
        length = int(headers["inference-header-content-length"])
        return status, json.loads(reply[:length])["outputs"][0], reply[length:]

    for count in (8, 32):
        data = np.arange(count, dtype=np.float32).tobytes()
        assert post("zero_1_float32", data) == (200, {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, count],
                                                      "parameters": {"binary_data_size": 4 * count}}, data)
    data = np.arange(6, dtype=np.float32).tobytes()
    status, output, body = post("unbatched_float32", data)
    assert (status, output["shape"], body) == (200, [2, 3], data)
    status, output, body = post("zero_1_object_1_element", b"427")
    assert (status, output["shape"], body) == (200, [1, 1], (3).to_bytes(4, "little") + b"427")
    prefix = "[request id: <id_unknown>] "
    assert post("zero_1_object", b"427") == (400, {}, {
        "error": f"{prefix}For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"})
    assert post("zero_1_float16", np.ones([2, 2], np.float16).tobytes()) == (400, {}, {
        "error": f"{prefix}The shape of the raw input 'INPUT0' can not be deduced because there are more than "
                 "one variable-sized dimension"})
    assert post("zero_3_float32", np.arange(24, dtype=np.float32).tobytes()) == (400, {}, {
        "error": f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in "
                 "'zero_3_float32' model configuration"})


def _document_model(repository: Path) -> None:
    """``mymodel`` of the V2 protocol's inference example: output0 a constant [3, 2]."""
    constant = helper.make_node("Constant", [], ["output0"], value=helper.make_tensor(
        "c", TensorProto.FLOAT, [3, 2], [1.0, 1.1, 2.0, 2.1, 3.0, 3.1]))
    model = make_model([constant, helper.make_node("Identity", ["input0"], ["unused0"]),
                        helper.make_node("Identity", ["input1"], ["unused1"])],
                       [("input0", TensorProto.UINT32, [2, 2]), ("input1", TensorProto.BOOL, [3])],
                       [("output0", TensorProto.FLOAT, [3, 2]), ("unused0", TensorProto.UINT32, [2, 2]),
                        ("unused1", TensorProto.BOOL, [3])])
    add_model(repository, "mymodel", model, "max_batch_size: 0")


def test_protocol_document_example(own_models: Server) -> None:
    """The V2 protocol's inference example, byte for byte where the document is consistent.

    The document's input1 is shape [3] with one value; three values are sent here.
    """
    request = {"id": "42", "inputs": [
        {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]},
        {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [True, False, True]}],
        "outputs": [{"name": "output0"}]}
    status, headers, body = http(own_models, "POST", "/v2/models/mymodel/infer", json.dumps(request).encode(),
                                 {"Content-Type": "application/json"})
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"model_name": "mymodel", "model_version": "1", "id": "42", "outputs": [
        {"name": "output0", "shape": [3, 2], "datatype": "FP32", "data": [1.0, 1.1, 2.0, 2.1, 3.0, 3.1]}]}


BAD = [  # (path, JSON body, gRPC status the same request gets, HTTP status)
    ("/v2/models/no_such_model/infer", {"inputs": []}, "NOT_FOUND", 404),
    ("/v2/models/simple/versions/9/infer", {"inputs": []}, "NOT_FOUND", 404),
    ("/v2/models/simple/infer", {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]},
     "INVALID_ARGUMENT", 400),
    ("/v2/models/simple/infer", {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}]},
     "INVALID_ARGUMENT", 400),
    ("/v2/models/simple/infer", {"inputs": [{"name": n, "shape": [9, 16], "datatype": "INT32", "data": [0] * 144}
                                            for n in ("INPUT0", "INPUT1")]}, "INVALID_ARGUMENT", 400),
    ("/v2/models/simple/infer", {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}
                                            for n in ("INPUT0", "INPUT1")],
                                 "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}, "INVALID_ARGUMENT", 400),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_same_error_class_as_grpc(example_server, case: int) -> None:
    import tritonclient.grpc as grpcclient

    path, body, grpc_status, http_status = BAD[case]
    status, _, reply = http(example_server, "POST", path, json.dumps(body).encode())
    assert status == http_status and "error" in json.loads(reply)
    parts = path.split("/")
    model, version = parts[3], parts[5] if "versions" in parts else ""
    inputs = []
    for item in body["inputs"]:
        tensor = grpcclient.InferInput(item["name"], item["shape"], item["datatype"])
        tensor.set_data_from_numpy(np.array(item["data"], dtype=np.float32 if item["datatype"] == "FP32" else np.int32)
                                   .reshape(item["shape"]))
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(o["name"]) for o in body.get("outputs", [])] or None
    with grpcclient.InferenceServerClient(example_server.url) as client, pytest.raises(InferenceServerException) as err:
        client.infer(model, inputs, model_version=version, outputs=outputs)
    assert err.value.status() == f"StatusCode.{grpc_status}"
    assert err.value.message() == json.loads(reply)["error"], "one error mapping, one message"


def test_same_outputs_as_grpc(example_server, hclient) -> None:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(example_server.url) as client:
        tensors = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        tensors[0].set_data_from_numpy(A)
        tensors[1].set_data_from_numpy(B)
        over_grpc = client.infer("simple", tensors)
    over_rest = hclient.infer("simple", _inputs())
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_array_equal(over_grpc.as_numpy(name), over_rest.as_numpy(name))


def test_limits_and_malformed_bodies(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--http-max-input-size", str(2**20))
    try:
        path = "/v2/models/identity_fp32/infer"
        header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2**18 + 8], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 4 * (2**18 + 8)}}]}).encode()
        status = http_early_reply(server, path, header + b"\0" * 4 * (2**18 + 8),
                                  {"Inference-Header-Content-Length": str(len(header))})
        assert status == 413
        bomb = gzip.compress(b"{" + b" " * (4 * 2**20) + b"}")
        status, _, _ = http(server, "POST", path, bomb, {"Content-Encoding": "gzip"})
        assert status == 413
        expanding = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2**20], "datatype": "FP32", "data": [0]}]})
        assert http(server, "POST", path, expanding.encode())[0] == 413  # declared size checked before allocating
        deep = b"[" * 120 + b"]" * 120
        assert http(server, "POST", path, deep)[0] == 400
        ok_depth = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                                           "data": json.loads("[" * 48 + "1.5" + "]" * 48)}]}).encode()
        assert http(server, "POST", path, ok_depth)[0] == 200
        very_deep = b"[" * 250_000 + b"]" * 250_000
        assert http(server, "POST", "/v2/repository/index", very_deep)[0] in (400, 413)
        for bad_length in ("99999999999", "-1", "abc"):
            assert http(server, "POST", path, b"{}", {"Inference-Header-Content-Length": bad_length})[0] == 400
        fp16 = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP16", "data": [1.0]}]})
        status, _, body = http(server, "POST", path, fp16.encode())
        assert status == 400 and "FP16" in json.loads(body)["error"]
        huge_dim = b'{"inputs": [{"name": "INPUT0", "shape": [6587395401693649698816], "datatype": "FP32", "data": []}]}'
        for garbage in (b"not json", b"[]", b'{"inputs": 3}', b'{"inputs": [{"name": "INPUT0"}]}', huge_dim):
            assert http(server, "POST", path, garbage)[0] == 400
        status, headers, body = http(server, "PUT", "/v2/health/live")  # Starlette's own errors, in V2's envelope
        assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
        assert set(headers["allow"].split(", ")) == {"GET", "HEAD"}  # Starlette lists a set: any order
        status, _, body = http(server, "GET", "/v2/nothing/here")
        assert (status, json.loads(body)) == (404, {"error": "Not Found"})
        assert http(server, "GET", "/v2/health/live")[0] == 200
    finally:
        assert server.stop() == 0


def test_model_control_over_http(tmp_path) -> None:
    repository = tmp_path / "repo"
    add_model(repository, "ident", identity_model(TensorProto.FLOAT))
    server = start_server(repository, tmp_path, "--model-control-mode", "explicit")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.get_model_repository_index() == [{"name": "ident"}]
        client.load_model("ident", config=json.dumps({"max_batch_size": "16"}))
        assert client.get_model_config("ident")["max_batch_size"] == 16
        model = identity_model(TensorProto.FLOAT).SerializeToString()
        client.load_model("fresh", config="{}", files={"file:2/model.onnx": model})
        assert client.get_model_metadata("fresh")["versions"] == ["2"]
        with pytest.raises(InferenceServerException) as err:
            client.load_model("../etc")  # the path itself does not match a route
        assert err.value.status() == "404"
        with pytest.raises(InferenceServerException) as err:
            client.load_model(" ..")  # reaches the name check
        assert err.value.status() == "400"
        status, _, body = http(server, "POST", "/v2/repository/models/fresh/load",
                               json.dumps({"parameters": {"config": "{}", "file:1/model.onnx": "not base64!"}}).encode())
        assert status == 400 and "base64" in json.loads(body)["error"]
        client.unload_model("ident")
        assert not client.is_model_ready("ident")
        assert {"name": "ident", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in client.get_model_repository_index()
        status, _, body = http(server, "POST", "/v2/repository/models/wrong_model_name/load")  # empty body accepted
        assert status == 500 and "failed to load" in json.loads(body)["error"]
    finally:
        client.close()
        assert server.stop() == 0


KSERVE_HEALTH = """
import asyncio, sys, httpx
from kserve import InferenceRESTClient, RESTConfig
async def main(url):
    client = InferenceRESTClient(config=RESTConfig(protocol="v2"))
    try:
        for call in (client.is_server_live(url), client.is_server_ready(url), client.is_model_ready(url, "simple")):
            try:
                print(await call)
            except httpx.HTTPStatusError as err:  # KServe's client raises for any non-2xx answer
                print(f"HTTP{err.response.status_code}:{err.response.json()}".replace(" ", ""))
    finally:
        await client.close()
asyncio.run(main(sys.argv[1]))
"""


def _kserve_health(server) -> list[str]:
    """KServe's own REST client (in a subprocess: it registers its own inference.* protobuf messages)."""
    done = subprocess.run([sys.executable, "-c", KSERVE_HEALTH, f"http://{server.http_url}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_kserve_rest_client_health_calls(example_server) -> None:
    assert _kserve_health(example_server) == ["True", "True", "True"]


def test_not_ready_answers(tmp_path) -> None:
    (tmp_path / "repo").mkdir()
    server = start_server(tmp_path / "repo", tmp_path)
    try:
        status, _, body = http(server, "GET", "/v2/health/ready")
        assert status == 400 and json.loads(body) == {"ready": False}
        assert _kserve_health(server) == ["True", "HTTP400:{'ready':False}", "False"]
    finally:
        assert server.stop() == 0


def test_timing_headers_are_present_and_consistent(hclient, example_server) -> None:
    body = json.dumps({"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
                                  for n in ("INPUT0", "INPUT1")]}).encode()
    for _ in range(5):
        status, headers, _ = http(example_server, "POST", "/v2/models/simple/infer", body)
        assert status == 200
        total = float(headers["x-total-time"])
        phases = {name: float(headers[name]) for name in ("x-queue-time", "x-tokenization-time", "x-inference-time")}
        assert total > 0 and all(value >= 0 for value in phases.values())
        assert all(total >= value for value in phases.values()), headers
        assert total >= sum(phases.values()) + float(headers.get("x-postprocessing-time", 0)) - 0.01


def test_json_numbers_non_finite_values_and_binary_parts(example_server) -> None:
    """FP32 data prints as the shortest text that reads back as the same float32; NaN and Infinity go in and come
    back as before; a bool is not an INT32; binary outputs sent as separate parts arrive whole after the JSON."""
    path = "/v2/models/identity_fp32/infer"
    plain = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.1, 0.1, 3, -2.5]}]}
    status, _, body = http(example_server, "POST", path, json.dumps(plain).encode())
    assert status == 200 and b'"data":[1.1,0.1,3.0,-2.5]' in body
    special = b'{"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [NaN, Infinity, 1.5]}]}'
    status, _, body = http(example_server, "POST", path, special)
    assert status == 200 and b'"data":[NaN,Infinity,1.5]' in body
    bools = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [True] + [1] * 15}
                        for n in ("INPUT0", "INPUT1")]}
    status, _, body = http(example_server, "POST", "/v2/models/simple/infer", json.dumps(bools).encode())
    assert status == 400 and "holds values that are not INT32" in json.loads(body)["error"]
    values = np.arange(2**16, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2**16], "datatype": "FP32",
                                     "parameters": {"binary_data_size": values.nbytes}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    status, headers, body = http(example_server, "POST", path, header + values.tobytes(),
                                 {"Inference-Header-Content-Length": str(len(header))})
    headers = {key.lower(): value for key, value in headers.items()}
    length = int(headers["inference-header-content-length"])
    assert status == 200 and int(headers["content-length"]) == len(body) == length + values.nbytes
    assert json.loads(body[:length])["outputs"][0]["parameters"]["binary_data_size"] == values.nbytes
    assert np.array_equal(np.frombuffer(body[length:], np.float32), values)
