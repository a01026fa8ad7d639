"""``ModelInferRequest`` from the bytes gRPC received, without a protobuf object and without copying
tensor data.

``decode_request`` walks the message's top-level fields once: each ``raw_input_contents`` entry
becomes a ``memoryview`` slice of the received buffer, ``id`` is read, and everything else (model
name and version, parameters, inputs, requested outputs) is the request's *header*. A client sends
the same header again and again (only the data and the id change), so headers are kept by their
bytes (at most ``MAX_HEADERS``, each under ``MAX_HEADER_BYTES`` and without typed contents, which
are data): a header seen before is not decoded again, and validation keeps what it derives from it
on the header (``RequestHeader.memo``).

The result is what upb (the ``protobuf`` package's parser) gives for the same bytes, field by field,
and the bytes upb refuses are refused (``WireError``): ``tests/unit/codec/test_codec_differential.py``
checks both on valid, mutated, truncated and hand-made messages. Rules followed besides
``kserve_v2.codec.wire``'s: the last value of a singular field wins; a message field sent twice
merges (repeated fields appended, the later oneof member set wins); a map entry with a field it
does not know (or a known one with another wire type) is dropped whole, as upb keeps such an entry
among the unknown fields.
"""

from __future__ import annotations

import struct

from kserve_v2.codec.contents import decode_contents
from kserve_v2.codec.messages import (
    UNSET, Buffer, InferParameter, InferRequest, InputTensor, RequestedOutput, RequestHeader,
    TensorContents,
)
from kserve_v2.codec.wire import FIXED64, LENGTH, VARINT, WireError, length, skip, tag, text, varint, varints

MAX_HEADERS = 1024
MAX_HEADER_BYTES = 4 << 10
_SIGN = 1 << 63
_DOUBLE = struct.Struct("<d")
_headers: dict[bytes, RequestHeader] = {}


def decode_request(data: bytes) -> InferRequest:
    """The ``ModelInferRequest`` serialized in ``data``; its raw entries are views of ``data``.

    Raises:
        WireError: ``data`` is not a valid ``ModelInferRequest`` (the transport answers
            INVALID_ARGUMENT).
    """
    end = len(data)
    pos = 0
    view = memoryview(data)
    raw: list[Buffer] = []
    request_id = ""
    kept: list[bytes] = []  # the header's bytes: every field but the id and the raw entries
    kept_from = 0
    while pos < end:
        start = pos
        byte = data[pos]
        if byte & 7 == LENGTH and 8 < byte < 0x80 and pos + 1 < end and data[pos + 1] < 0x80:
            field = byte >> 3  # the common case inline: a one-byte tag and a one-byte length
            first = pos + 2
            pos = first + data[pos + 1]
            if pos > end:
                raise WireError("length past the end of the message")
            if field != 7 and field != 3:
                continue
        else:
            field, wire, pos = tag(data, pos, end)
            if wire != LENGTH:
                pos = skip(data, pos, end, field, wire, 0)
                continue
            first, pos = length(data, pos, end)
            if field != 7 and field != 3:
                continue
        if field == 7:
            raw.append(view[first:pos])
        else:
            request_id = text(data, first, pos)
        if start > kept_from:
            kept.append(data[kept_from:start])
        kept_from = pos
    if kept_from == 0:
        described = data
    else:
        if end > kept_from:
            kept.append(data[kept_from:end])
        described = kept[0] if len(kept) == 1 else b"".join(kept)
    header = _headers.get(described)
    if header is None:
        header = _header(described)
        # typed contents are data, new with every request: such a header is not kept
        if len(described) <= MAX_HEADER_BYTES and all(tensor.contents is None for tensor in header.inputs):
            if len(_headers) >= MAX_HEADERS:
                _headers.clear()
            _headers[described] = header
    return InferRequest(header, request_id, raw)


def _header(data: bytes) -> RequestHeader:
    """The header fields of a message whose ``id`` and raw entries were cut out (``decode_request``)."""
    header = RequestHeader()
    end = len(data)
    pos = 0
    while pos < end:
        field, wire, pos = tag(data, pos, end)
        if wire != LENGTH or not 1 <= field <= 6:
            pos = skip(data, pos, end, field, wire, 0)
            continue
        start, pos = length(data, pos, end)
        if field == 1:
            header.model_name = text(data, start, pos)
        elif field == 2:
            header.model_version = text(data, start, pos)
        elif field == 4:
            _entry(data, start, pos, 1, header.parameters)
        elif field == 5:
            header.inputs.append(_input(data, start, pos))
        elif field == 6:
            header.outputs.append(_output(data, start, pos))
    return header


def _input(data: bytes, pos: int, end: int) -> InputTensor:
    tensor = InputTensor()
    shape = tensor.shape
    contents: TensorContents | None = None
    while pos < end:
        field, wire, pos = tag(data, pos, end)
        if field == 3 and wire == VARINT:
            value, pos = varint(data, pos, end)
            shape.append(value - (value & _SIGN) * 2)
        elif wire != LENGTH or not 1 <= field <= 5:
            pos = skip(data, pos, end, field, wire, 1)
        else:
            start, pos = length(data, pos, end)
            if field == 1:
                tensor.name = text(data, start, pos)
            elif field == 2:
                tensor.datatype = text(data, start, pos)
            elif field == 3:
                shape.extend(_signed(varints(data, start, pos)))
            elif field == 4:
                _entry(data, start, pos, 2, tensor.parameters)
            else:
                contents = decode_contents(data, start, pos, 2, contents)
    tensor.contents = contents
    return tensor


def _output(data: bytes, pos: int, end: int) -> RequestedOutput:
    output = RequestedOutput()
    while pos < end:
        field, wire, pos = tag(data, pos, end)
        if wire != LENGTH or field not in (1, 2):
            pos = skip(data, pos, end, field, wire, 1)
            continue
        start, pos = length(data, pos, end)
        if field == 1:
            output.name = text(data, start, pos)
        else:
            _entry(data, start, pos, 2, output.parameters)
    return output


def _entry(data: bytes, pos: int, end: int, depth: int, into: dict[str, InferParameter]) -> None:
    """Add one ``map<string, InferParameter>`` entry (at nesting ``depth``) to ``into``, unless it has a
    field an entry does not know (upb keeps such an entry among the unknown fields instead)."""
    key = ""
    value = UNSET
    known = True
    while pos < end:
        field, wire, pos = tag(data, pos, end)
        if wire == LENGTH and field in (1, 2):
            start, pos = length(data, pos, end)
            if field == 1:
                key = text(data, start, pos)
            else:
                value = _parameter(data, start, pos, depth + 1, value)
        else:
            known = False
            pos = skip(data, pos, end, field, wire, depth)
    if known:
        into[key] = value


def _parameter(data: bytes, pos: int, end: int, depth: int, value: InferParameter) -> InferParameter:
    """The ``InferParameter`` in ``data[pos:end]`` merged into ``value`` (a oneof member set here wins)."""
    while pos < end:
        field, wire, pos = tag(data, pos, end)
        if wire == VARINT and field in (1, 2, 5):
            number, pos = varint(data, pos, end)
            if field == 1:
                value = InferParameter("bool_param", number != 0)
            elif field == 2:
                value = InferParameter("int64_param", number - (number & _SIGN) * 2)
            else:
                value = InferParameter("uint64_param", number)
        elif wire == LENGTH and field == 3:
            start, pos = length(data, pos, end)
            value = InferParameter("string_param", text(data, start, pos))
        elif wire == FIXED64 and field == 4:
            if pos + 8 > end:
                raise WireError("truncated double")
            value = InferParameter("double_param", _DOUBLE.unpack_from(data, pos)[0])
            pos += 8
        else:
            pos = skip(data, pos, end, field, wire, depth)
    return value


def _signed(values: object) -> list[int]:
    """Unsigned 64-bit varint values as int64 (a list, or a uint64 array from a long packed run)."""
    if isinstance(values, list):
        return [v - (v & _SIGN) * 2 for v in values]
    return values.view("<i8").tolist()  # type: ignore[attr-defined, no-any-return]
