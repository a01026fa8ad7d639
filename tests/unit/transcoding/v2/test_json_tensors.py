"""transcoding.v2.json_tensors: V2 JSON infer bodies (with Triton's binary tensor data extension) to the
core's InferRequest, the core's InferResponse back to JSON and binary parts, and the refusals with
their texts, in-process."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from kserve_v2.codec.messages import InferParameter, InferResponse, OutputTensor
from kserve_v2.protocol.errors import InvalidInput, TooLarge
from kserve_v2.protocol.tensors import pack_bytes
from transcoding.v2.json_tensors import (
    HttpInfer, parse_detached, parse_infer_request, render_detached, render_infer_response,
)

MAX = 1 << 20


def _body(header: dict) -> bytes:
    return json.dumps(header).encode()


def _parse(header: dict, binary: bytes = b"", max_bytes: int = MAX) -> HttpInfer:
    text = _body(header)
    return parse_infer_request(text + binary, len(text) if binary else None, "m", "2", max_bytes)


def test_json_data_becomes_raw_bytes_and_parameters_keep_their_json_types() -> None:
    parsed = _parse({"id": "7", "parameters": {"priority": 3, "big": 2**63, "ratio": 0.5, "on": True, "s": "x"},
                     "inputs": [{"name": "A", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
                                {"name": "B", "datatype": "BYTES", "shape": [2], "data": ["é", ""]},
                                {"name": "C", "datatype": "BOOL", "shape": [1], "data": [True]}],
                     "outputs": [{"name": "Y", "parameters": {"binary_data": True, "classification": 2}}]})
    request = parsed.request
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "7")
    assert request.parameters == {"priority": InferParameter("int64_param", 3), "big": InferParameter("uint64_param", 2**63),
                                  "ratio": InferParameter("double_param", 0.5), "on": InferParameter("bool_param", True),
                                  "s": InferParameter("string_param", "x")}
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [("A", "INT32", [2, 2]), ("B", "BYTES", [2]),
                                                                      ("C", "BOOL", [1])]
    assert request.raw_input_contents == [np.array([1, 2, 3, 4], "<i4").tobytes(),
                                          pack_bytes(np.array(["é", ""], dtype=object)), b"\x01"]
    assert [o.name for o in request.outputs] == ["Y"] and parsed.binary_outputs == {"Y"} and not parsed.all_binary
    assert request.outputs[0].parameters == {"classification": InferParameter("int64_param", 2)}


def test_binary_inputs_are_views_of_the_body_in_input_order() -> None:
    a, b = np.arange(3, dtype="<f4").tobytes(), np.arange(2, dtype="<i8").tobytes()
    parsed = _parse({"parameters": {"binary_data_output": True},
                     "inputs": [{"name": "A", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}},
                                {"name": "S", "datatype": "FP32", "shape": [3],
                                 "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 12}},
                                {"name": "B", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 16}}]},
                    a + b)
    raw = parsed.request.raw_input_contents
    assert [type(entry) for entry in raw] == [memoryview, memoryview]  # no copy of the body
    assert [bytes(entry) for entry in raw] == [a, b]  # the shared memory input has no raw entry
    assert parsed.all_binary and "binary_data_output" not in parsed.request.parameters
    assert parsed.request.inputs[1].parameters["shared_memory_region"] == InferParameter("string_param", "r")


def test_a_detached_request_holds_bytes_that_pickle() -> None:
    a = np.arange(3, dtype="<f4").tobytes()
    header = _body({"inputs": [{"name": "A", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}}]})
    detached = parse_detached(header + a, len(header), "m", "", MAX)
    assert detached.request.raw_input_contents == [a] and type(detached.request.raw_input_contents[0]) is bytes


@pytest.mark.parametrize(("header", "binary", "text"), [
    ([1], b"", "must be a JSON object with an 'inputs' list"),
    ({"inputs": [{"datatype": "INT32", "shape": [1], "data": [1]}]}, b"", "each input must be an object with a 'name'"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [True], "data": [1]}]}, b"",
     "input 'A' needs a 'datatype' string and a 'shape' list of int64 integers"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [2**63], "data": [1]}]}, b"", "list of int64 integers"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1]}]}, b"", "input 'A' has no 'data' and no binary_data_size"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1], "parameters": {"binary_data_size": 4}}]},
     b"1234", "input 'A' has both 'data' and binary_data_size"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 8}}]}, b"1234",
     "binary_data_size of input 'A' does not fit the binary data of the body"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 2}}]}, b"1234",
     "the body has 2 bytes of binary data that no input claims"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1],
                  "parameters": {"shared_memory_region": "r"}}]}, b"", "input 'A' has both 'data' and shared memory parameters"),
    ({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [True]}]}, b"",
     "data of input 'A' holds values that are not INT32"),
    ({"inputs": [{"name": "A", "datatype": "BOOL", "shape": [1], "data": [1]}]}, b"", "holds values that are not BOOL"),
    ({"inputs": [{"name": "A", "datatype": "INT8", "shape": [1], "data": [300]}]}, b"", "does not fit INT8"),
    ({"inputs": [{"name": "A", "datatype": "BYTES", "shape": [1], "data": [1]}]}, b"",
     "BYTES data of input 'A' must be JSON strings"),
    ({"inputs": [{"name": "A", "datatype": "FP16", "shape": [1], "data": [1.0]}]}, b"",
     "receiving FP16 data via JSON is not supported. Please use the binary data format for input A"),
    ({"inputs": [{"name": "A", "datatype": "INT33", "shape": [1], "data": [1]}]}, b"", "unknown datatype 'INT33'"),
    ({"inputs": [], "parameters": [1]}, b"", "parameters of request must be a JSON object"),
    ({"inputs": [], "parameters": {"p": [1]}}, b"", "parameter 'p' must be a string, number or boolean"),
    # an integer past uint64 stays one where the standard library parses (here for the NaN beside it)
    ({"inputs": [], "parameters": {"p": 2**64, "q": math.nan}}, b"", "parameter 'p' does not fit int64 or uint64"),
    ({"inputs": [], "outputs": [{"name": 3}]}, b"", "each requested output must be an object with a 'name'"),
    ({"inputs": [], "outputs": [{"name": "Y", "parameters": "x"}]}, b"", "parameters of output 'Y' must be a JSON object"),
])
def test_malformed_bodies_are_invalid_input_naming_what_is_wrong(header: object, binary: bytes, text: str) -> None:
    encoded = json.dumps(header).encode()
    with pytest.raises(InvalidInput, match=re.escape(text)):
        parse_infer_request(encoded + binary, len(encoded) if binary else None, "m", "", MAX)


def test_a_header_length_outside_the_body_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="Inference-Header-Content-Length 10 is outside the 2-byte body"):
        parse_infer_request(b"{}", 10, "m", "", MAX)


def test_json_data_whose_declared_shape_exceeds_the_limit_is_too_large() -> None:
    header = {"inputs": [{"name": "A", "datatype": "FP64", "shape": [1000, 1000], "data": [1.0]}]}
    with pytest.raises(TooLarge, match=r"input 'A' of shape \[1000, 1000\] would take 8000000 bytes, over the 1048576"):
        _parse(header)
    assert _parse(header, max_bytes=8_000_000).request.raw_input_contents == [np.float64(1.0).tobytes()]


def _response(*outputs: tuple[str, str, list[int], bytes], parameters: dict | None = None) -> InferResponse:
    return InferResponse("m", "1", "r1", parameters or {}, [OutputTensor(n, d, s) for n, d, s, _ in outputs],
                         [raw for *_, raw in outputs])


def test_json_outputs_keep_float32_short_and_bytes_as_text() -> None:
    response = _response(("F", "FP32", [2], np.array([1.1, -2.5], "<f4").tobytes()),
                         ("S", "BYTES", [2], pack_bytes(np.array([b"ab", b"\xff"], dtype=object))),
                         parameters={"sequence_end": InferParameter("bool_param", True)})
    parts, length = render_infer_response(response, HttpInfer(_parse({"inputs": []}).request))
    assert length is None and len(parts) == 1
    assert json.loads(parts[0]) == {"model_name": "m", "model_version": "1", "id": "r1",
                                    "parameters": {"sequence_end": True},
                                    "outputs": [{"name": "F", "datatype": "FP32", "shape": [2], "data": [1.1, -2.5]},
                                                {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["ab", "\ufffd"]}]}


def test_non_finite_floats_are_written_as_the_standard_library_writes_them() -> None:
    response = _response(("F", "FP64", [3], np.array([math.nan, math.inf, 1.0], "<f8").tobytes()))
    [text], _ = render_infer_response(response, HttpInfer(_parse({"inputs": []}).request))
    assert b'"data":[NaN,Infinity,1.0]' in text


def test_binary_outputs_follow_the_json_header_whose_length_is_returned() -> None:
    raw = np.arange(4, dtype="<i4").tobytes()
    parsed = _parse({"inputs": [], "outputs": [{"name": "B", "parameters": {"binary_data": True}}, {"name": "J"}]})
    response = _response(("B", "INT32", [4], raw), ("J", "INT32", [1], np.int32(5).tobytes()))
    parts, length = render_infer_response(response, parsed)
    assert parts[1:] == [raw] and length == len(parts[0])
    outputs = json.loads(parts[0])["outputs"]
    assert outputs == [{"name": "B", "datatype": "INT32", "shape": [4], "parameters": {"binary_data_size": 16}},
                       {"name": "J", "datatype": "INT32", "shape": [1], "data": [5]}]
    detached_parts, detached_length = render_detached(response, parsed)
    assert detached_parts == [bytes(part) for part in parts] and detached_length == length


def test_an_output_in_shared_memory_is_named_only() -> None:
    response = _response(("O", "FP32", [1], b""))
    response.outputs[0].parameters["shared_memory_region"] = InferParameter("string_param", "r")
    [text], length = render_infer_response(response, HttpInfer(_parse({"inputs": []}).request, all_binary=True))
    assert length is None and json.loads(text)["outputs"] == [{"name": "O", "datatype": "FP32", "shape": [1]}]


def test_an_fp16_output_asked_for_as_json_is_refused_with_tritons_text() -> None:
    response = _response(("H", "FP16", [1], np.float16(1).tobytes()))
    with pytest.raises(InvalidInput, match="sending FP16 data via JSON is not supported. Please use the binary data "
                                           "format for output H"):
        render_infer_response(response, HttpInfer(_parse({"inputs": []}).request))
