"""Differential fuzz: the codec (kserve_v2.codec) against upb, the ``protobuf`` package's parser.

The same bytes go to ``codec.requests.decode_request`` and to ``ModelInferRequest.FromString``;
both must refuse them, or both must give the same fields (inputs, shapes, parameters with their
oneof member, typed contents with ``HasField`` and every value, outputs, raw entries). The bytes
are valid messages, the same messages written another way (fields in any order, repeated scalars
unpacked or split, fields sent twice, unknown fields and groups, non-minimal varints), mutated
ones (truncated, bytes changed, inserted or removed, two messages concatenated) and soups of
random fields. Responses go the other way: what the codec writes must parse into the message the
generated classes build. CI runs a seeded, bounded budget; ``make fuzz`` a long one
(``KSERVE_V2_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.codec import requests as codec_requests
from kserve_v2.codec.messages import (
    CONTENTS_FIELDS, InferParameter, InferRequest, InferResponse, OutputTensor, TensorContents,
)
from kserve_v2.codec.requests import decode_request
from kserve_v2.codec.responses import encode_head, encode_response, encode_stream_error, encode_stream_response
from kserve_v2.codec.wire import WireError

BUDGET = int(os.environ.get("KSERVE_V2_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=BUDGET, deadline=None, derandomize=BUDGET <= 1000,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- both sides as comparable values ---------------------------------------------------------

Field = tuple[int, int, Any]  # (number, wire type, int | bytes | list[Field] for a message or group)


def _float_bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _upb_parameter(value: pb.InferParameter) -> tuple[str | None, Any]:
    choice = value.WhichOneof("parameter_choice")
    found = getattr(value, choice) if choice else None
    return choice, _float_bits(found) if choice == "double_param" else found


def _codec_parameter(value: InferParameter) -> tuple[str | None, Any]:
    found = value.value if value.choice else None
    return value.choice, _float_bits(found) if value.choice == "double_param" else found  # type: ignore[arg-type]


def _upb_contents(tensor: Any) -> dict[str, list[Any]] | None:
    if not tensor.HasField("contents"):
        return None
    return {fd.name: [_float_bits(v) if isinstance(v, float) else v for v in values]
            for fd, values in tensor.contents.ListFields()}


def _codec_contents(contents: TensorContents | None) -> dict[str, list[Any]] | None:
    if contents is None:
        return None
    assert list(contents.fields) == [name for name in CONTENTS_FIELDS if name in contents.fields]  # field order
    out = {}
    for name, values in contents.fields.items():
        items = values if isinstance(values, list) else values.tolist()
        out[name] = [_float_bits(v) if isinstance(v, float) else bytes(v) if isinstance(v, memoryview) else v
                     for v in items]
    return out


def upb_view(message: pb.ModelInferRequest) -> dict[str, Any]:
    return {"model_name": message.model_name, "model_version": message.model_version, "id": message.id,
            "parameters": {k: _upb_parameter(v) for k, v in message.parameters.items()},
            "inputs": [(t.name, t.datatype, list(t.shape), {k: _upb_parameter(v) for k, v in t.parameters.items()},
                        _upb_contents(t)) for t in message.inputs],
            "outputs": [(o.name, {k: _upb_parameter(v) for k, v in o.parameters.items()}) for o in message.outputs],
            "raw": list(message.raw_input_contents)}


def codec_view(request: InferRequest) -> dict[str, Any]:
    return {"model_name": request.model_name, "model_version": request.model_version, "id": request.id,
            "parameters": {k: _codec_parameter(v) for k, v in request.parameters.items()},
            "inputs": [(t.name, t.datatype, list(t.shape), {k: _codec_parameter(v) for k, v in t.parameters.items()},
                        _codec_contents(t.contents)) for t in request.inputs],
            "outputs": [(o.name, {k: _codec_parameter(v) for k, v in o.parameters.items()}) for o in request.outputs],
            "raw": [bytes(entry) for entry in request.raw_input_contents]}


def assert_same(data: bytes) -> None:
    """The codec and upb agree on ``data``: both refuse it, or both give the same request."""
    try:
        expected: dict[str, Any] | None = upb_view(pb.ModelInferRequest.FromString(data))
    except DecodeError:
        expected = None
    try:
        found: dict[str, Any] | None = codec_view(decode_request(data))
    except WireError:
        found = None
    assert found == expected, data


# ---- a wire writer of our own for the test's variants -----------------------------------------


def _varint(value: int, pad: int = 0) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or pad:
            out.append(byte | 0x80)
            if not value:
                pad -= 1
                while pad:
                    out.append(0x80)
                    pad -= 1
                out.append(0)
                break
        else:
            out.append(byte)
            break
    return bytes(out)


def write(fields: list[Field], pad: int = 0) -> bytes:
    """Serialize a field list; ``pad`` extra continuation bytes on every tag and length (non-minimal
    varints: a tag of more than 5 bytes is refused)."""
    out = bytearray()
    for number, wire, payload in fields:
        out += _varint(number << 3 | wire, pad)
        if wire == 0:  # a value, or a varint written by hand (oversized)
            out += payload if isinstance(payload, bytes) else _varint(payload)
        elif wire in (1, 5):
            out += payload
        elif wire == 2:
            body = write(payload, pad) if isinstance(payload, list) else payload
            out += _varint(len(body), pad) + body
        elif wire == 3:
            out += write(payload, pad) + _varint(number << 3 | 4, pad)
    return bytes(out)


def _parameter_fields(value: pb.InferParameter) -> list[Field]:
    choice = value.WhichOneof("parameter_choice")
    if choice == "bool_param":  # any non-zero varint is true
        return [(1, 0, 2**63 + 2 if value.bool_param else 0)]
    if choice == "int64_param":
        return [(2, 0, value.int64_param)]
    if choice == "string_param":
        return [(3, 2, value.string_param.encode())]
    if choice == "double_param":
        return [(4, 1, struct.pack("<d", value.double_param))]
    if choice == "uint64_param":
        return [(5, 0, value.uint64_param)]
    return []


def _map_fields(number: int, parameters: Any) -> list[Field]:
    return [(number, 2, [(1, 2, k.encode()), (2, 2, _parameter_fields(v))]) for k, v in parameters.items()]


_SCALARS = {"bool_contents": (0, None), "int_contents": (0, None), "int64_contents": (0, None),
            "uint_contents": (0, None), "uint64_contents": (0, None), "fp32_contents": (5, "<f"),
            "fp64_contents": (1, "<d")}


def _scalar_fields(number: int, wire: int, fmt: str | None, values: list[Any], packed: bool, high: int = 0
                   ) -> list[Field]:
    """Values of a repeated scalar field; ``high``: bits above the 32 that a bool, int32 or uint32
    field drops (upb keeps the low 32 bits, and reads any non-zero bool as true)."""
    def one(value: Any) -> Any:
        if fmt:
            return struct.pack(fmt, value)
        if number in (1, 2, 4):  # bool, int32, uint32
            return (int(value) & 0xFFFFFFFF | high << 32) if value else 0
        return int(value)
    if packed:
        return [(number, 2, b"".join(one(v) if fmt else _varint(one(v)) for v in values))]
    return [(number, wire, one(v)) for v in values]


@st.composite
def rewritten(draw: st.DrawFn, message: pb.ModelInferRequest) -> bytes:
    """``message`` written another way: fields reordered, repeated scalars packed or not and split in
    two, a message field sent as two halves, unknown fields and groups among the known ones."""
    def split(values: list[Any]) -> tuple[list[Any], list[Any]]:
        cut = draw(st.integers(0, len(values)))
        return values[:cut], values[cut:]

    def scalars(number: int, wire: int, fmt: str | None, values: list[Any]) -> list[Field]:
        head, tail = split(values)
        return (_scalar_fields(number, wire, fmt, head, draw(st.booleans()))
                + _scalar_fields(number, wire, fmt, tail, draw(st.booleans())))

    def unknown() -> list[Field]:
        return draw(st.lists(soup_fields(st.sampled_from([9, 10, 15, 16, 100, 2**29 - 1])), max_size=2))

    def shuffled(fields: list[Field]) -> list[Field]:
        return draw(st.permutations(fields + unknown()))

    top: list[Field] = [(1, 2, message.model_name.encode()), (2, 2, message.model_version.encode()),
                        (3, 2, message.id.encode())] + _map_fields(4, message.parameters)
    for tensor in message.inputs:
        inner: list[Field] = [(1, 2, tensor.name.encode()), (2, 2, tensor.datatype.encode())]
        inner += scalars(3, 0, None, list(tensor.shape)) + _map_fields(4, tensor.parameters)
        if tensor.HasField("contents"):
            halves: tuple[list[Field], list[Field]] = ([], [])
            for fd, values in tensor.contents.ListFields():
                first, second = split(list(values))
                if fd.name == "bytes_contents":
                    halves[0].extend((8, 2, v) for v in first)
                    halves[1].extend((8, 2, v) for v in second)
                else:
                    wire, fmt = _SCALARS[fd.name]
                    high = draw(st.sampled_from([0, 0, 1, 2**31, 2**32 - 1]))
                    halves[0].extend(_scalar_fields(fd.number, wire, fmt, first, draw(st.booleans()), high))
                    halves[1].extend(_scalar_fields(fd.number, wire, fmt, second, draw(st.booleans()), high))
            inner.append((5, 2, shuffled(halves[0])))
            if draw(st.booleans()):
                inner.append((5, 2, shuffled(halves[1])))
            else:
                inner[-1][2].extend(halves[1])
        top.append((5, 2, shuffled(inner)))
    for output in message.outputs:
        top.append((6, 2, shuffled([(1, 2, output.name.encode())] + _map_fields(2, output.parameters))))
    top += [(7, 2, raw) for raw in message.raw_input_contents]
    ordered = shuffled(top) if draw(st.booleans()) else top  # both parsers read the same bytes: any order
    return write(ordered, draw(st.sampled_from([0, 0, 1, 4])))


def soup_fields(numbers: st.SearchStrategy[int]) -> st.SearchStrategy[Field]:
    """Random fields: any wire type, nested messages and groups."""
    leaf = st.one_of(
        st.tuples(numbers, st.just(0), st.integers(0, 2**64 - 1)),
        st.tuples(numbers, st.just(1), st.binary(min_size=8, max_size=8)),
        st.tuples(numbers, st.just(5), st.binary(min_size=4, max_size=4)),
        st.tuples(numbers, st.just(2), st.binary(max_size=12)),
    )
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(numbers, st.just(2), st.lists(inner, max_size=4)),
        st.tuples(numbers, st.just(3), st.lists(inner, max_size=3))), max_leaves=12)


FIELD_NUMBERS = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8])

# ---- valid messages --------------------------------------------------------------------------

TEXT = st.text(max_size=6) | st.sampled_from(["INPUT0", "OUTPUT0", "FP32", "simple", "shared_memory_region"])
INT64 = st.integers(-(2**63), 2**63 - 1)


def _parameter(draw: st.DrawFn, target: pb.InferParameter) -> None:
    kind = draw(st.sampled_from(["bool", "int64", "uint64", "string", "double", "unset"]))
    if kind == "bool":
        target.bool_param = draw(st.booleans())
    elif kind == "int64":
        target.int64_param = draw(INT64)
    elif kind == "uint64":
        target.uint64_param = draw(st.integers(0, 2**64 - 1))
    elif kind == "string":
        target.string_param = draw(st.text(max_size=8))
    elif kind == "double":
        target.double_param = draw(st.floats(allow_nan=True, allow_infinity=True))
    else:
        target.SetInParent()


def _parameters(draw: st.DrawFn, target: Any) -> None:
    for key in draw(st.lists(TEXT, max_size=2)):
        _parameter(draw, target[key])


@st.composite
def messages(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=draw(TEXT), model_version=draw(TEXT), id=draw(TEXT))
    _parameters(draw, message.parameters)
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(name=draw(TEXT), datatype=draw(TEXT), shape=draw(st.lists(INT64, max_size=4)))
        _parameters(draw, tensor.parameters)
        if draw(st.booleans()):
            contents = tensor.contents
            contents.SetInParent()
            for name in draw(st.lists(st.sampled_from(CONTENTS_FIELDS), max_size=3, unique=True)):
                values = {
                    "bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
                    "int64_contents": INT64, "uint_contents": st.integers(0, 2**32 - 1),
                    "uint64_contents": st.integers(0, 2**64 - 1),
                    "fp32_contents": st.floats(width=32, allow_nan=True), "fp64_contents": st.floats(allow_nan=True),
                    "bytes_contents": st.binary(max_size=5)}[name]
                getattr(contents, name).extend(draw(st.lists(values, max_size=80)))
    for _ in range(draw(st.integers(0, 2))):
        _parameters(draw, message.outputs.add(name=draw(TEXT)).parameters)
    message.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40), max_size=3)))
    return message


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(messages()).SerializeToString())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["truncate", "set", "insert", "delete", "concatenate", "varint"]))
        if kind == "truncate":
            del data[at:]
        elif kind == "set" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 4))]
        elif kind == "concatenate":
            data += draw(messages()).SerializeToString()
        elif kind == "varint":  # an oversized or unterminated varint
            data[at:at] = b"\xff" * draw(st.integers(9, 11)) + draw(st.sampled_from([b"", b"\x01", b"\x7f"]))
    return bytes(data)


# ---- requests ----------------------------------------------------------------------------------


@FUZZ
@given(message=messages())
def test_valid_messages_decode_as_upb_decodes_them(message: pb.ModelInferRequest) -> None:
    data = message.SerializeToString()
    assert codec_view(decode_request(data)) == upb_view(message)


@FUZZ
@given(data=messages().flatmap(rewritten))
def test_messages_written_another_way_decode_as_upb_decodes_them(data: bytes) -> None:
    assert_same(data)


@FUZZ
@given(data=mutated())
def test_mutated_messages_are_refused_or_decoded_as_upb_does(data: bytes) -> None:
    assert_same(data)


@FUZZ
@given(fields=st.lists(soup_fields(FIELD_NUMBERS), max_size=6), pad=st.sampled_from([0, 0, 1, 2, 4, 9]))
def test_random_fields_are_refused_or_decoded_as_upb_does(fields: list[Field], pad: int) -> None:
    assert_same(write(fields, pad))
    # the same fields as an input, an output, a parameter value, a map entry and typed contents
    for outer in ([(5, 2, fields)], [(6, 2, fields)], [(4, 2, [(1, 2, b"k"), (2, 2, fields)])], [(4, 2, fields)],
                  [(5, 2, [(5, 2, fields)])]):
        assert_same(write(outer, pad))


def _groups(depth: int) -> bytes:
    return b"\x43" * depth + b"\x44" * depth


def _delimited(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _varint(len(body)) + body


@pytest.mark.parametrize("data", [
    b"\x08\x05", b"\x02\x00", b"\x0a\x01a\x0a\x01b", b"\x0a\x01\xff", b"\x0a\x03\xed\xa0\x80", b"\x0a\x02\xc0\x80",
    b"\x00\x01", b"\x0e", b"\x0f", b"\x0c", b"\x43\x08\x01\x44", b"\x43\x4c", b"\x43\x08\x01", b"\x0b\x0c",
    b"\x40" + b"\xff" * 9 + b"\x7f", b"\x40" + b"\xff" * 10 + b"\x01", b"\x80\x80\x80\x80\x10\x00",
    b"\x88\x80\x80\x80\x80\x00\x00", b"\x8a\x80\x80\x80\x00\x01a", b"\xf8\xff\xff\xff\x0f\x00",
    b"\x0a\x81\x80\x80\x80\x80\x80\x80\x80\x80\x00a", b"\x0a\x05ab", b"\x2a\x01\x0c", b"\x2a\x02\x0b\x0c",
    b"\x2a\x02\x0b\x14", b"\x2a\x04\x32\x02\x00\x00", b"\x2a\x00", b"\x2a\x02\x2a\x00",
    _delimited(0x22, b"\x0a\x01k\x12\x02\x10\x05\x18\x01"),  # an entry with an unknown field: dropped
    _delimited(0x22, b"\x0a\x01k\x12\x04\x10\x05\x30\x01"),  # the value's unknown field: kept
    _delimited(0x22, b"\x0a\x01k\x12\x02\x08\x01\x12\x02\x10\x05\x12\x00"),  # merged values
    _delimited(0x22, b"\x12\x02\x10\x05"), _delimited(0x22, b""),
    _groups(100), _groups(101), _delimited(0x2a, _groups(99)), _delimited(0x2a, _groups(100)),
    _delimited(0x22, b"\x0a\x01k" + _delimited(0x12, _groups(98))),
    _delimited(0x22, b"\x0a\x01k" + _delimited(0x12, _groups(99))),
], ids=repr)
def test_edges_of_the_wire_format_as_upb_reads_them(data: bytes) -> None:
    """Cases found by probing upb: wrong wire types skipped, strict UTF-8, tags of at most 5 bytes and
    32 bits, varints of at most 10, unmatched groups, nesting up to 100, map entries with unknown
    fields dropped whole, message fields merged."""
    assert_same(data)


@st.composite
def long_runs(draw: st.DrawFn) -> bytes:
    """Typed contents as long runs of unpacked elements (what the codec decodes in bulk), one field
    after another, sometimes cut short, broken by an oversized varint or by another field."""
    fields: list[Field] = []
    for _ in range(draw(st.integers(1, 4))):
        number = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7]))
        count = draw(st.integers(0, 1500))
        if number in (6, 7):
            width = 4 if number == 6 else 8
            payload = draw(st.binary(min_size=width, max_size=width))
            fields += [(number, 5 if number == 6 else 1, payload)] * count
        else:
            value = draw(st.sampled_from([0, 1, 127, 128, 2**32 + 5, 2**63, 2**64 - 1]))
            run: list[Field] = [(number, 0, value + i % 3) for i in range(count)]
            if count and draw(st.booleans()):  # one value of 10 bytes (the most a varint may have) or 11
                run[draw(st.integers(0, count - 1))] = (number, 0, b"\xff" * draw(st.sampled_from([9, 10])) + b"\x01")
            fields += run
    data = write([(5, 2, [(5, 2, fields)])])
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return data


@FUZZ
@given(data=long_runs())
def test_long_unpacked_runs_decode_as_upb_decodes_them(data: bytes) -> None:
    assert_same(data)


def test_each_request_is_decoded_from_a_fresh_header_cache_too() -> None:
    """The header cache gives what a fresh decode gives (the fuzz above mostly hits it)."""
    message = pb.ModelInferRequest(model_name="m", id="1")
    message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.raw_input_contents.append(bytes(8))
    data = message.SerializeToString()
    cached = decode_request(data)
    codec_requests._headers.clear()
    assert codec_view(decode_request(data)) == codec_view(cached) == upb_view(message)


# ---- responses ---------------------------------------------------------------------------------


def _pb_parameters(target: Any, parameters: dict[str, InferParameter]) -> None:
    for key, value in parameters.items():
        if value.choice is None:
            target[key].SetInParent()
        else:
            setattr(target[key], value.choice, value.value)


PARAMETERS = st.dictionaries(TEXT, st.one_of(
    st.builds(InferParameter, st.just("bool_param"), st.booleans()),
    st.builds(InferParameter, st.just("int64_param"), INT64),
    st.builds(InferParameter, st.just("uint64_param"), st.integers(0, 2**64 - 1)),
    st.builds(InferParameter, st.just("double_param"), st.floats(allow_nan=False)),
    st.builds(InferParameter, st.just("string_param"), st.text(max_size=5)),
    st.just(InferParameter(None, ""))), max_size=2)


@st.composite
def responses(draw: st.DrawFn) -> InferResponse:
    outputs = [OutputTensor(draw(TEXT), draw(TEXT), draw(st.lists(INT64, max_size=3)), draw(PARAMETERS))
               for _ in range(draw(st.integers(0, 3)))]
    raws = [np.frombuffer(draw(st.binary(max_size=24)), np.uint8).data for _ in outputs]
    response = InferResponse(draw(TEXT), draw(TEXT), draw(TEXT), draw(PARAMETERS), outputs, list(raws))
    if draw(st.booleans()):
        response.head = encode_head(response.model_name, response.model_version, outputs)
    return response


def expected_message(response: InferResponse) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                    id=response.id)
    _pb_parameters(message.parameters, response.parameters)
    for tensor in response.outputs:
        out = message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        _pb_parameters(out.parameters, tensor.parameters)
    message.raw_output_contents.extend(bytes(raw) for raw in response.raw_output_contents)
    return message


@FUZZ
@given(response=responses())
def test_responses_parse_into_the_message_the_generated_classes_build(response: InferResponse) -> None:
    expected = expected_message(response)
    assert pb.ModelInferResponse.FromString(encode_response(response)) == expected
    stream = pb.ModelStreamInferResponse.FromString(encode_stream_response(response))
    assert stream == pb.ModelStreamInferResponse(infer_response=expected)


@FUZZ
@given(message=st.text(max_size=20), ids=st.tuples(TEXT, TEXT, TEXT))
def test_stream_errors_parse_as_triton_writes_them(message: str, ids: tuple[str, str, str]) -> None:
    request_id, model, version = ids
    parsed = pb.ModelStreamInferResponse.FromString(encode_stream_error(message, request_id, model, version))
    assert parsed == pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(
        id=request_id, model_name=model, model_version=version))
