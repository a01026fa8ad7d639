"""V2 JSON inference bodies (with Triton's binary tensor data extension) <-> ModelInferRequest/Response.

Request body (Triton's binary tensor data extension, ``extension_binary_data.md``): a JSON header, then the bytes of every input
that has ``parameters.binary_data_size``, in input order; ``Inference-Header-Content-Length``
gives the header's length when binary data follows. JSON ``data`` (nested or flat) becomes raw
bytes; every input not in shared memory reaches the core in ``raw_input_contents``, so validation happens once, in
``kserve_v2.request.decode``. Here only what JSON itself needs is checked: types of values, the
binary layout, nesting depth and the bytes a declared shape would allocate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from kserve_v2.backend import Parameter
from kserve_v2.protocol import datatypes
from kserve_v2.codec.messages import (
    Buffer, InferParameter, InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput, RequestHeader,
)
from kserve_v2.protocol.datatypes import BYTES
from kserve_v2.protocol.errors import InvalidInput, TooLarge
from kserve_v2.protocol.tensors import pack_bytes, unpack_bytes
from transcoding.http.json_io import load_json

_ARRAY_OR_NONE = (np.ndarray, type(None))
_NO_JSON = ("FP16", "BF16")


@dataclass
class HttpInfer:
    """A transcoded request and how its outputs go back: binary or JSON. The request's raw entries
    are binary data as views of the body (no copy), and JSON data as bytes."""

    request: InferRequest
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
    request = InferRequest(RequestHeader(model, version), str(header.get("id", "")))
    parsed = HttpInfer(request)
    for key, value in _parameters(header, "request").items():
        if key == "binary_data_output":
            parsed.all_binary = bool(value)
        else:
            request.parameters[key] = _parameter(value, key)
    offset = 0
    for item in header["inputs"]:
        offset = _add_input(parsed, item, binary, offset, max_bytes)
    if offset != len(binary):
        raise InvalidInput(f"the body has {len(binary) - offset} bytes of binary data that no input claims")
    for item in header.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name'")
        output = RequestedOutput(item["name"])
        request.outputs.append(output)
        for key, value in _parameters(item, "output", item["name"]).items():
            if key == "binary_data":
                if value:
                    parsed.binary_outputs.add(item["name"])
            else:
                output.parameters[key] = _parameter(value, key)
    return parsed


def render_infer_response(response: InferResponse, parsed: HttpInfer) -> tuple[list[Buffer], int | None]:
    """Render the response: JSON, plus binary blobs for the outputs asked for that way.

    Args:
        response: the core's response; its raw contents (the buffers gRPC sends, views of the output
            arrays) are sent as they are for binary outputs, and read as arrays for JSON ones.

    Returns:
        (body parts to send in order, header length) - the length is None when the body is all JSON.

    Raises:
        InvalidInput: an FP16/BF16 output requested as JSON.
    """
    header: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        header["id"] = response.id
    if response.parameters:  # Triton writes a response's parameters as a JSON object
        header["parameters"] = {key: _parameter_value(value) for key, value in response.parameters.items()}
    outputs, blobs = [], []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if "shared_memory_region" in tensor.parameters:
            pass  # written into the client's region: named only, no data and no parameters, as Triton answers
        elif parsed.all_binary or tensor.name in parsed.binary_outputs:
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _json_values(raw, tensor)
        outputs.append(entry)
    header["outputs"] = outputs
    text = _dump(header)
    if not blobs or not any(len(blob) for blob in blobs):
        return [text], None
    return [text, *blobs], len(text)


def parse_detached(body: bytes, header_length: int | None, model: str, version: str, max_bytes: int) -> HttpInfer:
    """``parse_infer_request`` for a worker process: binary inputs as bytes, not views of the body
    (a view does not pickle). Same errors."""
    parsed = parse_infer_request(body, header_length, model, version, max_bytes)
    raw = parsed.request.raw_input_contents
    raw[:] = [bytes(entry) for entry in raw]
    return parsed


def render_detached(response: InferResponse, parsed: HttpInfer) -> tuple[list[bytes], int | None]:
    """``render_infer_response`` for a worker process: ``response`` as ``detached`` gives it, every
    part as bytes (a view does not pickle). Same errors."""
    parts, length = render_infer_response(response, parsed)
    return [bytes(part) for part in parts], length


def detached(response: InferResponse) -> InferResponse:
    """``response`` with its raw contents as bytes, for a worker process (a view does not pickle)."""
    return InferResponse(response.model_name, response.model_version, response.id, response.parameters,
                         response.outputs, [bytes(raw) for raw in response.raw_output_contents])



def _dump(header: dict[str, Any]) -> bytes:
    """Compact JSON. Output data held as numpy arrays is written by orjson straight from the buffer
    (float32 as the shortest text that reads back as the same float32); a response with data as
    Python lists (BYTES, non-finite floats) is written by the standard library as before
    (``\\u`` escapes, NaN and Infinity), numeric arrays beside them as lists."""
    if all(isinstance(entry.get("data"), _ARRAY_OR_NONE) for entry in header["outputs"]):
        return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(header, separators=(",", ":"), default=_array_list).encode()


def _array_list(value: Any) -> list[Any]:
    """The standard library's fallback for what it cannot write: a numeric output array as a list."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return _float_list(value) if value.dtype.kind == "f" else list(value.tolist())


def _parameter_value(value: InferParameter) -> Parameter:
    """A response parameter's value as JSON takes it (the field its ``parameter_choice`` names)."""
    return value.value if value.choice is not None else ""


def _float_list(values: np.ndarray) -> list[float]:
    if values.dtype == np.float32:  # the shortest text that reads back as the same float32 (1.1, not 1.100000023841858)
        return [float(text) for text in values.astype(str)]
    floats: list[float] = values.tolist()
    return floats


def _add_input(parsed: HttpInfer, item: Any, binary: memoryview, offset: int, max_bytes: int) -> int:
    request = parsed.request
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidInput("each input must be an object with a 'name'")
    name, datatype, shape = item["name"], item.get("datatype"), item.get("shape")
    if type(datatype) is not str or type(shape) is not list or not _int64_list(shape):
        raise InvalidInput(f"input '{name}' needs a 'datatype' string and a 'shape' list of int64 integers")
    tensor = InputTensor(name, datatype, shape)
    request.inputs.append(tensor)
    parameters = _parameters(item, "input", name)
    size = parameters.pop("binary_data_size", None) if parameters else None
    for key, value in parameters.items():
        tensor.parameters[key] = _parameter(value, key)
    raw = request.raw_input_contents
    if size is not None:
        if "data" in item:
            raise InvalidInput(f"input '{name}' has both 'data' and binary_data_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            raise InvalidInput(f"binary_data_size of input '{name}' does not fit the binary data of the body")
        raw.append(binary[offset : offset + size])
        return offset + size
    if parameters and any(k.startswith("shared_memory") for k in parameters):
        if "data" in item:
            raise InvalidInput(f"input '{name}' has both 'data' and shared memory parameters")
        return offset  # no raw entry: the core reads it from the region
    if "data" not in item:
        raise InvalidInput(f"input '{name}' has no 'data' and no binary_data_size")
    raw.append(_json_to_raw(item["data"], datatype, shape, name, max_bytes))
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
    declared = dtype.itemsize
    for dim in shape:
        declared *= max(dim, 0)
    if declared > max_bytes:
        raise TooLarge(f"input '{name}' of shape {shape} would take {declared} bytes, over the {max_bytes}-byte limit")
    # parsed JSON holds exact types (bool is not taken for a number, nor a number for a bool)
    kinds = set(map(type, flat))
    if dtype.numpy.kind == "b":
        valid = kinds <= {bool}
    elif dtype.numpy.kind in "iu":
        valid = kinds <= {int}
    else:
        valid = kinds <= {int, float}
    if not valid:
        raise InvalidInput(f"data of input '{name}' holds values that are not {datatype}")
    try:
        return np.array(flat, dtype=dtype.numpy).tobytes()
    except (OverflowError, ValueError) as err:
        raise InvalidInput(f"data of input '{name}' does not fit {datatype}: {err}") from None


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if list not in set(map(type, data)):
        return data  # already flat
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


def _json_values(raw: Buffer, tensor: OutputTensor) -> list[Any] | np.ndarray:
    """An output's values for JSON from its raw contents (BYTES elements as text)."""
    dtype = _dtype(tensor.datatype)
    if tensor.datatype in _NO_JSON:
        raise InvalidInput(f"sending {tensor.datatype} data via JSON is not supported. Please use the binary data "
                           f"format for output {tensor.name}")  # Triton's text
    if dtype is BYTES:
        items = unpack_bytes(raw, math.prod(tensor.shape), f"output '{tensor.name}'")
        return [item.decode("utf-8", errors="replace") for item in items]
    values = np.frombuffer(raw, dtype.numpy)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        return _float_list(values)  # NaN and Infinity as the standard library writes them
    return values  # written by orjson from the buffer (see _dump)


def _dtype(datatype: str) -> datatypes.DType:
    dtype = datatypes.BY_V2.get(datatype)
    if dtype is None:
        raise InvalidInput(f"unknown datatype '{datatype}'")
    return dtype


def _parameters(item: dict[str, Any], kind: str, name: str = "") -> dict[str, Any]:
    """A copy of the ``parameters`` object of the request (``kind`` "request") or of a named input
    or output (an empty dict when there is none).

    Raises:
        InvalidInput: ``parameters`` is not a JSON object.
    """
    parameters = item.get("parameters")
    if not parameters:
        return {}
    if type(parameters) is not dict:
        what = kind if kind == "request" else f"{kind} '{name}'"
        raise InvalidInput(f"parameters of {what} must be a JSON object")
    return dict(parameters)


def _int64_list(values: list[Any]) -> bool:
    """Whether every value is a JSON integer (not a boolean) that fits int64."""
    for value in values:
        if type(value) is not int or not -(2**63) <= value < 2**63:
            return False
    return True


def _parameter(value: Any, key: str) -> InferParameter:
    """A JSON parameter value as an ``InferParameter``.

    Raises:
        InvalidInput: an integer beyond uint64, or a value that is not a string, number or boolean.
    """
    if isinstance(value, bool):
        return InferParameter("bool_param", value)
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return InferParameter("int64_param", value)
        if 0 <= value < 2**64:  # a uint64 such as a large sequence_id
            return InferParameter("uint64_param", value)
        raise InvalidInput(f"parameter '{key}' does not fit int64 or uint64")
    if isinstance(value, float):
        return InferParameter("double_param", value)
    if isinstance(value, str):
        return InferParameter("string_param", value)
    raise InvalidInput(f"parameter '{key}' must be a string, number or boolean")
