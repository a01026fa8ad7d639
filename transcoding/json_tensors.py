"""V2 JSON inference bodies (with Triton's binary tensor data extension) <-> ModelInferRequest/Response.

Request body (``triton-protocol-notes.md`` 2.2): a JSON header, then the bytes of every input
that has ``parameters.binary_data_size``, in input order; ``Inference-Header-Content-Length``
gives the header's length when binary data follows. JSON ``data`` (nested or flat) becomes raw
bytes; every input not in shared memory reaches the core in ``raw_input_contents``, so validation happens once, in
``kserve_v2.inference``. Here only what JSON itself needs is checked: types of values, the
binary layout, nesting depth and the bytes a declared shape would allocate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kserve_v2 import datatypes
from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.datatypes import BYTES
from kserve_v2.errors import InvalidInput, TooLarge
from kserve_v2.tensors import pack_bytes, unpack_bytes

MAX_JSON_DEPTH = 100
_NO_JSON = ("FP16", "BF16")


@dataclass
class HttpInfer:
    """A transcoded request and how its outputs go back: binary or JSON."""

    request: pb.ModelInferRequest
    binary_outputs: set[str] = field(default_factory=set)
    all_binary: bool = False


def parse_infer_request(body: bytes, header_length: int | None, model: str, version: str, max_bytes: int) -> HttpInfer:
    """Transcode a JSON (+ binary) infer body.

    Args:
        body: the whole (decompressed) body.
        header_length: ``Inference-Header-Content-Length``, or None when the body is all JSON.
        model, version: from the URL.
        max_bytes: the largest tensor a JSON ``data`` list may expand to.

    Raises:
        InvalidInput: bad JSON, nesting deeper than 100, a header length outside the body,
            binary sizes that do not add up, JSON values of the wrong type, FP16/BF16 in JSON.
        TooLarge: JSON data whose declared shape would exceed ``max_bytes``.
    """
    if header_length is not None and not 0 <= header_length <= len(body):
        raise InvalidInput(f"Inference-Header-Content-Length {header_length} is outside the {len(body)}-byte body")
    split = len(body) if header_length is None else header_length
    header = load_json(body[:split])
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InvalidInput("the inference request must be a JSON object with an 'inputs' list")
    binary = memoryview(body)[split:]
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=str(header.get("id", "")))
    parsed = HttpInfer(request)
    for key, value in _parameters(header, "request").items():
        if key == "binary_data_output":
            parsed.all_binary = bool(value)
        else:
            _set_parameter(request.parameters[key], value, key)
    offset = 0
    for item in header["inputs"]:
        offset = _add_input(request, item, binary, offset, max_bytes)
    if offset != len(binary):
        raise InvalidInput(f"the body has {len(binary) - offset} bytes of binary data that no input claims")
    for item in header.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name'")
        output = request.outputs.add(name=item["name"])
        for key, value in _parameters(item, f"output '{item['name']}'").items():
            if key == "binary_data":
                if value:
                    parsed.binary_outputs.add(item["name"])
            else:
                _set_parameter(output.parameters[key], value, key)
    return parsed


def raw_binary_request(body: bytes, model: str, version: str, metadata: pb.ModelMetadataResponse) -> HttpInfer:
    """``Inference-Header-Content-Length: 0``: the body is the bytes of the model's only input, batch 1.

    Raises:
        InvalidInput: the model does not have exactly one input.
    """
    if len(metadata.inputs) != 1:
        raise InvalidInput(f"a raw binary request needs a model with one input; '{model}' has {len(metadata.inputs)}")
    tensor = metadata.inputs[0]
    dtype = _dtype(tensor.datatype)
    shape = [1 if d == -1 else d for d in tensor.shape]
    if dtype is BYTES:
        shape = [1] * len(tensor.shape)
    elif -1 in tensor.shape[1:] and dtype.itemsize:
        variable = list(tensor.shape).index(-1, 1)
        fixed = math.prod(d for i, d in enumerate(shape) if i != variable)
        shape[variable] = len(body) // max(fixed * dtype.itemsize, 1)
    request = pb.ModelInferRequest(model_name=model, model_version=version, raw_input_contents=[body])
    request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
    return HttpInfer(request, all_binary=True)


def render_infer_response(response: pb.ModelInferResponse, parsed: HttpInfer) -> tuple[bytes, int | None]:
    """Render the response: JSON, plus binary blobs for the outputs asked for that way.

    Returns:
        (body, header length) - the length is None when the body is all JSON.

    Raises:
        InvalidInput: an FP16/BF16 output requested as JSON.
    """
    header: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        header["id"] = response.id
    outputs, blobs = [], []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if "shared_memory_region" in tensor.parameters:
            pass  # written into the client's region: named only, no data and no parameters, as Triton answers
        elif parsed.all_binary or tensor.name in parsed.binary_outputs:
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _json_values(raw, tensor)
        outputs.append(entry)
    header["outputs"] = outputs
    text = json.dumps(header, separators=(",", ":")).encode()
    if not any(blobs):
        return text, None
    return b"".join([text, *blobs]), len(text)  # one copy of the blobs, not two


def load_json(data: bytes | memoryview) -> Any:
    """Parse JSON, refusing nesting deeper than 100 (Triton's limit).

    Raises:
        InvalidInput: malformed or too deeply nested JSON -> 400.
    """
    try:
        value = json.loads(bytes(data) if data else b"{}")
    except RecursionError:
        raise InvalidInput(f"JSON nesting is deeper than {MAX_JSON_DEPTH}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise InvalidInput(f"malformed JSON: {err}") from None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidInput(f"JSON nesting is deeper than {MAX_JSON_DEPTH}")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


def _add_input(request: pb.ModelInferRequest, item: Any, binary: memoryview, offset: int, max_bytes: int) -> int:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidInput("each input must be an object with a 'name'")
    name, datatype, shape = item["name"], item.get("datatype"), item.get("shape")
    if not isinstance(datatype, str) or not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and -(2**63) <= d < 2**63 for d in shape):
        raise InvalidInput(f"input '{name}' needs a 'datatype' string and a 'shape' list of int64 integers")
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    parameters = _parameters(item, f"input '{name}'")
    size = parameters.pop("binary_data_size", None)
    for key, value in parameters.items():
        _set_parameter(tensor.parameters[key], value, key)
    if size is not None:
        if "data" in item:
            raise InvalidInput(f"input '{name}' has both 'data' and binary_data_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            raise InvalidInput(f"binary_data_size of input '{name}' does not fit the binary data of the body")
        request.raw_input_contents.append(bytes(binary[offset : offset + size]))
        return offset + size
    if any(k.startswith("shared_memory") for k in parameters):
        if "data" in item:
            raise InvalidInput(f"input '{name}' has both 'data' and shared memory parameters")
        return offset  # no raw entry: the core reads it from the region
    if "data" not in item:
        raise InvalidInput(f"input '{name}' has no 'data' and no binary_data_size")
    request.raw_input_contents.append(_json_to_raw(item["data"], datatype, shape, name, max_bytes))
    return offset


def _json_to_raw(data: Any, datatype: str, shape: list[int], name: str, max_bytes: int) -> bytes:
    dtype = _dtype(datatype)
    if datatype in _NO_JSON:
        raise InvalidInput(f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                           f"format for input {name}")  # Triton's text
    flat = _flatten(data)
    if dtype is BYTES:
        if not all(isinstance(v, str) for v in flat):
            raise InvalidInput(f"BYTES data of input '{name}' must be JSON strings")
        return pack_bytes(np.array(flat, dtype=object))
    declared = math.prod(max(d, 0) for d in shape) * dtype.itemsize
    if declared > max_bytes:
        raise TooLarge(f"input '{name}' of shape {shape} would take {declared} bytes, over the {max_bytes}-byte limit")
    if dtype.numpy.kind == "b":
        valid = all(isinstance(v, bool) for v in flat)
    elif dtype.numpy.kind in "iu":
        valid = all(isinstance(v, int) and not isinstance(v, bool) for v in flat)
    else:
        valid = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat)
    if not valid:
        raise InvalidInput(f"data of input '{name}' holds values that are not {datatype}")
    try:
        return np.array(flat, dtype=dtype.numpy).tobytes()
    except (OverflowError, ValueError) as err:
        raise InvalidInput(f"data of input '{name}' does not fit {datatype}: {err}") from None


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _json_values(raw: bytes, tensor: pb.ModelInferResponse.InferOutputTensor) -> list[Any]:
    dtype = _dtype(tensor.datatype)
    if tensor.datatype in _NO_JSON:
        raise InvalidInput(f"sending {tensor.datatype} data via JSON is not supported. Please use the binary data "
                           f"format for output {tensor.name}")  # Triton's text
    if dtype is BYTES:
        items = unpack_bytes(raw, math.prod(tensor.shape), f"output '{tensor.name}'")
        return [item.decode("utf-8", errors="replace") for item in items]
    values = np.frombuffer(raw, dtype=dtype.numpy)
    if values.dtype == np.float32:  # the shortest text that reads back as the same float32 (1.1, not 1.100000023841858)
        return [float(text) for text in values.astype(str)]
    return values.tolist()


def _dtype(datatype: str) -> datatypes.DType:
    dtype = datatypes.BY_V2.get(datatype)
    if dtype is None:
        raise InvalidInput(f"unknown datatype '{datatype}'")
    return dtype


def _parameters(item: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"parameters of {what} must be a JSON object")
    return dict(parameters)


def _set_parameter(target: pb.InferParameter, value: Any, key: str) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if -(2**63) <= value < 2**63:
            target.int64_param = value
        elif 0 <= value < 2**64:  # a uint64 such as a large sequence_id
            target.uint64_param = value
        else:
            raise InvalidInput(f"parameter '{key}' does not fit int64 or uint64")
    elif isinstance(value, float):
        target.double_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        raise InvalidInput(f"parameter '{key}' must be a string, number or boolean")
