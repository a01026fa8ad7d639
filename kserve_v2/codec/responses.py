"""``ModelInferResponse`` and ``ModelStreamInferResponse`` to bytes, without a protobuf object.

A response is written as one ``bytes`` (grpc.aio sends only ``bytes``): its small fields, then each
``raw_output_contents`` entry's tag and length followed by the entry's buffer, all joined once, so
an output array's bytes are copied once, straight into the message. Fields are written as proto3
writes them (empty strings and empty repeated fields left out, a oneof member always written), so
upb parses the result into the message the generated classes would have built
(``tests/unit/codec/test_codec_differential.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

from kserve_v2.codec.messages import Buffer, InferParameter, InferResponse, OutputTensor
from kserve_v2.codec.wire import FIXED64, LENGTH, VARINT, delimited, encode_varint, key

_DOUBLE = struct.Struct("<d")
_RAW = key(6, LENGTH)
_STREAM_RESPONSE = key(2, LENGTH)
_CHOICE_KEYS = {"bool_param": key(1, VARINT), "int64_param": key(2, VARINT), "string_param": key(3, LENGTH),
                "double_param": key(4, FIXED64), "uint64_param": key(5, VARINT)}


def encode_response(response: InferResponse) -> bytes:
    """The serialized ``ModelInferResponse`` (each raw output copied once, into the result)."""
    return b"".join(response_parts(response)[0])


def encode_stream_response(response: InferResponse) -> bytes:
    """The serialized ``ModelStreamInferResponse`` carrying ``response`` (no error message)."""
    return b"".join(stream_parts(response)[0])


def response_parts(response: InferResponse) -> tuple[list[Buffer], int]:
    """The serialized ``ModelInferResponse`` as parts to join (the raw outputs' buffers among them,
    not copied), and their total size: ``encode_response`` is their join."""
    head = response.head
    if head is None:
        head = encode_head(response.model_name, response.model_version, response.outputs)
    parts: list[Buffer] = [head]
    if response.id:
        parts.append(_strings(((3, response.id),)))
    if response.parameters:
        parts.append(encode_parameters(4, response.parameters))
    size = sum(map(len, parts))
    for raw in response.raw_output_contents:
        nbytes = raw.nbytes if isinstance(raw, memoryview) else len(raw)
        prefix = _RAW + encode_varint(nbytes)
        parts.append(prefix)
        parts.append(raw)
        size += len(prefix) + nbytes
    return parts, size


def stream_parts(response: InferResponse) -> tuple[list[Buffer], int]:
    """``response_parts`` of the ``ModelStreamInferResponse`` carrying ``response``."""
    parts, size = response_parts(response)
    prefix = _STREAM_RESPONSE + encode_varint(size)
    return [prefix, *parts], size + len(prefix)


def encode_stream_error(message: str, request_id: str, model_name: str, model_version: str,
                        parameters: Mapping[str, InferParameter] | None = None) -> bytes:
    """The serialized ``ModelStreamInferResponse`` of a failed request: ``error_message`` and a response
    naming the request's id, model and version, with ``parameters`` if any (Triton's ``ModelStreamInfer``)."""
    inner = _strings(((3, request_id), (1, model_name), (2, model_version)))
    if parameters:
        inner += encode_parameters(4, parameters)
    return _strings(((1, message),)) + delimited(2, inner)


def encode_head(model_name: str, model_version: str, outputs: Sequence[OutputTensor]) -> bytes:
    """The ``model_name``, ``model_version`` and ``outputs`` fields of a response (``InferResponse.head``)."""
    return _strings(((1, model_name), (2, model_version))) + b"".join(delimited(5, _output(o)) for o in outputs)


def encode_parameters(field: int, parameters: Mapping[str, InferParameter]) -> bytes:
    """A ``map<string, InferParameter>`` field: one entry per key."""
    return b"".join(delimited(field, _strings(((1, name),)) + delimited(2, _parameter(value)))
                    for name, value in parameters.items())


def _output(tensor: OutputTensor) -> bytes:
    out = _strings(((1, tensor.name), (2, tensor.datatype)))
    if tensor.shape:
        out += delimited(3, b"".join(encode_varint(dim) for dim in tensor.shape))
    if tensor.parameters:
        out += encode_parameters(4, tensor.parameters)
    return out


def _parameter(value: InferParameter) -> bytes:
    if value.choice is None:
        return b""
    tag = _CHOICE_KEYS[value.choice]
    if value.choice == "string_param":
        encoded = str(value.value).encode()
        return tag + encode_varint(len(encoded)) + encoded
    if value.choice == "double_param":
        return tag + _DOUBLE.pack(float(value.value))
    return tag + encode_varint(int(value.value))


def _strings(fields: Iterable[tuple[int, str]]) -> bytes:
    """Non-empty string fields, as proto3 writes them."""
    return b"".join(delimited(number, value.encode()) for number, value in fields if value)
