"""Small behaviours matched to Triton's qa tests: a chunked raw binary body (L0_http), the input named
when several fail their BYTES element count (L0_input_validation), ``--metrics-config`` numbers read
as C++ ``std::stod`` reads them (L0_metrics), and ``instruction`` on ``/v1/embeddings``."""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from helpers import SENTENCES, TextModels, add_model, identity_model, make_model, metrics_text, start_server


def _zero_1_float32(repository) -> None:
    add_model(repository, "onnx_zero_1_float32", identity_model(TensorProto.FLOAT, [None, None]),
              'max_batch_size: 8\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]')


def _object_int32_int32(repository) -> None:
    """L0_input_validation's onnx_object_int32_int32 as far as the test reads it: two BYTES [16] inputs."""
    nodes = [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in range(2)]
    add_model(repository, "onnx_object_int32_int32", make_model(
        nodes, [(f"INPUT{i}", TensorProto.STRING, [None, 16]) for i in range(2)],
        [(f"OUTPUT{i}", TensorProto.STRING, [None, 16]) for i in range(2)]), "max_batch_size: 8")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    _zero_1_float32(repository)
    _object_int32_int32(repository)
    running = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0


def test_a_raw_binary_body_chunk_encoded_by_the_caller(server) -> None:
    """L0_http test_content_encoding_chunked_manually, as it sends it: ``requests`` adds a Content-Length
    beside the caller's ``Transfer-Encoding: chunked``; the body is read as chunked (RFC 9112 6.1), and
    the connection closed after the response."""
    input_bytes = np.arange(8, dtype=np.float32).tobytes()
    chunk_encoded_input = f"{len(input_bytes):X}\r\n".encode() + input_bytes + b"\r\n" + b"0\r\n\r\n"
    headers = {"Inference-Header-Content-Length": "0", "Transfer-Encoding": "chunked"}
    r = requests.post(f"http://{server.http_url}/v2/models/onnx_zero_1_float32/infer", data=chunk_encoded_input,
                      headers=headers, timeout=30)
    r.raise_for_status()
    assert r.request.headers["Content-Length"] == str(len(chunk_encoded_input))  # the request was framed both ways
    header_size = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[header_size:] == input_bytes
    assert r.headers["Connection"] == "close"


def _send(server, head: str, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(f"POST /v2/models/onnx_zero_1_float32/infer HTTP/1.1\r\nHost: test\r\n{head}\r\n".encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_a_transfer_encoding_not_ending_in_chunked_is_refused(server) -> None:
    """The body of a request whose Transfer-Encoding does not end with ``chunked`` has no length: 400 and
    close, with or without a Content-Length (the length is not read to the connection's end)."""
    body = b"5\r\nhello\r\n0\r\n\r\n"
    for head in ("Transfer-Encoding: gzip\r\n", f"Transfer-Encoding: gzip\r\nContent-Length: {len(body)}\r\n"):
        reply = _send(server, head, body)
        assert reply.startswith(b"HTTP/1.1 400 "), reply
        assert b"does not end with chunked" in reply


def test_a_chunked_body_with_a_wrong_content_length_is_read_as_chunked(server) -> None:
    """Transfer-Encoding overrides Content-Length: the length a chunked request also gives is ignored."""
    data = np.arange(4, dtype=np.float32).tobytes()
    body = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    reply = _send(server, "Inference-Header-Content-Length: 0\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                  body)
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert reply.endswith(data) and b"connection: close" in reply.lower()


def test_input_string_shape_validation(server) -> None:
    """L0_input_validation test_input_string_shape_validation: both BYTES inputs hold 14 (then 18) elements
    under a [1, 16] shape; Triton reports INPUT1, the first input its core checks."""
    input_size = 16
    model_name = "onnx_object_int32_int32"

    def get_input_array(size: int) -> list[grpcclient.InferInput]:
        input_array = np.array([str(x) for x in np.random.randint(0, 127, size)], dtype=object).reshape(1, size)
        inputs = [grpcclient.InferInput(f"INPUT{i}", list(input_array.shape), np_to_triton_dtype(np.dtype(object)))
                  for i in range(2)]
        for item in inputs:
            item.set_data_from_numpy(input_array)
        return inputs

    with grpcclient.InferenceServerClient(server.url) as triton_client:
        inputs = get_input_array(input_size - 2)
        inputs[0].set_shape((1, input_size))
        inputs[1].set_shape((1, input_size))
        with pytest.raises(InferenceServerException) as e:
            triton_client.infer(model_name=model_name, inputs=inputs)
        assert (f"expected {input_size} string elements for inference input 'INPUT1' for model '{model_name}', "
                f"got {input_size - 2}") in str(e.value)

        inputs = get_input_array(input_size + 2)
        inputs[0].set_shape((1, input_size))
        inputs[1].set_shape((1, input_size))
        with pytest.raises(InferenceServerException) as e:
            triton_client.infer(model_name=model_name, inputs=inputs)
        assert (f"unexpected number of string elements {input_size + 1} for inference input 'INPUT1' for model "
                f"'{model_name}', expecting {input_size}") in str(e.value)


SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us", "nv_inference_compute_input_summary_us",
             "nv_inference_compute_infer_summary_us", "nv_inference_compute_output_summary_us")


def test_summaries_custom_quantiles_as_l0_metrics_sets_them(tmp_path) -> None:
    """L0_metrics test.sh's ``summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01``: Triton reads each number with
    ``std::stod`` (``0.0.1`` is 0.0), so the server starts and every summary has quantiles 0.1, 0.7 and
    0.75 (metrics_config_test.py test_summaries_custom_quantiles, which scrapes before any request: the
    model reporter makes a version's summaries when it loads), each with its ``_count`` and ``_sum``."""
    summary_quantiles = "0.1:0.0.1,0.7:0.01,0.75:0.01"
    repository = tmp_path / "repo"
    _zero_1_float32(repository)
    running = start_server(repository, tmp_path, "--metrics-config", "summary_latencies=true",
                           "--metrics-config", f"summary_quantiles={summary_quantiles}")
    labels = {"model": "onnx_zero_1_float32", "version": "1"}
    try:
        metrics = metrics_text(running.metrics_port)
        for quantile in [pair.split(":")[0] for pair in summary_quantiles.split(",")]:
            assert f'quantile="{quantile}"' in metrics
        for family in text_string_to_metric_families(metrics):
            if family.name in SUMMARIES:  # before any request: NaN quantiles, a count and sum of 0
                assert [(s.name, s.labels) for s in family.samples] == [
                    *((family.name, {**labels, "quantile": q}) for q in ("0.1", "0.7", "0.75")),
                    (f"{family.name}_count", labels), (f"{family.name}_sum", labels)]
                assert [s.value for s in family.samples][3:] == [0, 0]
                assert all(math.isnan(s.value) for s in family.samples[:3])
        data = np.arange(10, dtype=np.float32).tobytes()
        for _ in range(10):
            r = requests.post(f"http://{running.http_url}/v2/models/onnx_zero_1_float32/infer", data=data,
                              headers={"Inference-Header-Content-Length": "0"}, timeout=30)
            r.raise_for_status()
        families = {family.name: family for family in text_string_to_metric_families(metrics_text(running.metrics_port))}
        for name in SUMMARIES:
            assert families[name].type == "summary"
            samples = {(s.name, s.labels.get("quantile")): s.value for s in families[name].samples}
            assert 0 <= samples[(name, "0.1")] <= samples[(name, "0.7")] <= samples[(name, "0.75")]
            assert samples[(f"{name}_count", None)] == 10 and samples[(f"{name}_sum", None)] > 0
    finally:
        assert running.stop() == 0


MINILM, PREFIXED = "all-MiniLM-L6-v2", "prefixed-minilm"


def _post(running, path: str, body: object) -> dict:
    r = requests.post(f"http://{running.http_url}{path}", json=body, headers={"Accept": "application/json"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_embeddings_take_the_instruction_encode_takes(tmp_path, text_models: TextModels) -> None:
    """``instruction`` on /v1/embeddings, as on /v1/encode: one request parameter, which the text backend
    puts (then a space) ahead of the prefix ``prompt_name`` chooses: the vector is that of
    "<instruction> <prefix><text>"."""
    repository = text_models.link_into(tmp_path / "repo", (MINILM,))
    (repository / PREFIXED).mkdir()
    (repository / PREFIXED / "1").symlink_to(repository / MINILM / "1", target_is_directory=True)
    (repository / PREFIXED / "config.pbtxt").write_text(
        f'name: "{PREFIXED}"\nbackend: "text_embedding"\n'
        'parameters { key: "query_prefix" value { string_value: "query: " } }\n'
        'parameters { key: "document_prefix" value { string_value: "passage: " } }\n')
    running = start_server(repository, tmp_path / "logs", "--model-control-mode", "explicit",
                           "--load-model", MINILM, "--load-model", PREFIXED)
    instruction, text = "Represent this sentence for searching relevant passages:", SENTENCES[0]

    def embedding(model: str, given: str, **fields: str) -> np.ndarray:
        body = _post(running, "/v1/embeddings", {"model": model, "input": given, **fields})
        return np.array(body["data"][0]["embedding"], dtype=np.float32)

    def encoded(model: str, given: str, **params: str) -> np.ndarray:
        body = _post(running, f"/v1/encode/{model}", {"items": [{"text": given}], "params": params})
        return np.array(body["items"][0]["dense"]["values"], dtype=np.float32)

    try:
        for prompt_name, prefix in (("document", "passage: "), ("query", "query: ")):
            instructed = embedding(PREFIXED, text, instruction=instruction, prompt_name=prompt_name)
            np.testing.assert_allclose(instructed, encoded(PREFIXED, text, instruction=instruction, prompt_name=prompt_name),
                                       atol=1e-6)
            np.testing.assert_allclose(instructed, embedding(MINILM, f"{instruction} {prefix}{text}"), atol=1e-5)
            assert float(instructed @ embedding(PREFIXED, text, prompt_name=prompt_name)) < 0.99  # it changed the vector
        np.testing.assert_allclose(embedding(MINILM, text, instruction="query:\n"), embedding(MINILM, f"query:\n{text}"),
                                   atol=1e-5)  # no space after an instruction that ends in white space
        np.testing.assert_array_equal(embedding(MINILM, text, instruction=""), embedding(MINILM, text))
        r = requests.post(f"http://{running.http_url}/v1/embeddings", json={"model": MINILM, "input": text, "instruction": 1},
                          timeout=60)
        assert r.status_code == 400 and "instruction" in r.json()["error"]["message"]
    finally:
        assert running.stop() == 0
