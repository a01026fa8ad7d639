"""Protocol Buffers wire format primitives: varints, tags, skipping unknown fields, strings.

Written to the encoding guide of the Protocol Buffers documentation ("Encoding", protobuf.dev) and
to what upb, the parser of the ``protobuf`` Python package, accepts and refuses:

- a varint has at most 10 bytes; bits past the 64th are dropped; a tag is a varint of at most 5
  bytes whose value fits 32 bits, with a field number of 1 or more;
- wire types 6 and 7, and an end-group tag outside a group of the same field, are errors;
- an unknown field (or a known field sent with another wire type) is skipped, groups included; the
  nesting of messages and groups stops at ``MAX_DEPTH`` (upb's default limit);
- ``string`` fields must hold valid UTF-8 (proto3), ``bytes`` fields anything.

Every function reads ``data[pos:end]`` without copying and raises ``WireError`` for bytes that are
not a valid message. ``packed_varints`` decodes a packed run of varints with numpy, so that a
large typed tensor costs no Python loop per element.
"""

from __future__ import annotations

import numpy as np

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
MASK64 = (1 << 64) - 1
MAX_DEPTH = 100  # messages and groups nested in the top-level message (upb's default)
_TAG_LIMIT = 1 << 32


class WireError(ValueError):
    """Bytes that are not a valid message of the expected type (the caller words the client's error)."""


def varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value as an unsigned 64-bit integer, position after it) of the varint at ``pos``.

    Raises:
        WireError: the varint runs past ``end`` or over 10 bytes.
    """
    if pos >= end:
        raise WireError("truncated varint")
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & MASK64, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint over 10 bytes")


def tag(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, position after the tag) of the tag at ``pos``.

    Raises:
        WireError: a truncated or oversized tag, field number 0, wire type 6 or 7.
    """
    byte = data[pos]
    if byte < 0x80:
        value, pos = byte, pos + 1
    else:
        start = pos
        value, pos = varint(data, pos, end)
        if pos - start > 5 or value >= _TAG_LIMIT:
            raise WireError("tag over 32 bits")
    field, wire = value >> 3, value & 7
    if field == 0 or wire > FIXED32:
        raise WireError(f"invalid tag {value}")
    return field, wire, pos


def length(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, stop) of the length-delimited value whose length prefix is at ``pos``.

    Raises:
        WireError: the prefix is malformed or the value runs past ``end``.
    """
    if pos < end and data[pos] < 0x80:
        size, pos = data[pos], pos + 1
    else:
        size, pos = varint(data, pos, end)
    stop = pos + size
    if stop > end:
        raise WireError("length past the end of the message")
    return pos, stop


def skip(data: bytes, pos: int, end: int, field: int, wire: int, depth: int) -> int:
    """The position after the value of an unknown field whose tag ended at ``pos``.

    ``depth``: how many messages and groups enclose this field (0 at the top level).

    Raises:
        WireError: a truncated value, an unmatched end-group tag, or groups nested past ``MAX_DEPTH``.
    """
    if wire == VARINT:
        return varint(data, pos, end)[1]
    if wire == LENGTH:
        return length(data, pos, end)[1]
    if wire == FIXED32:
        pos += 4
    elif wire == FIXED64:
        pos += 8
    elif wire == START_GROUP:
        return _skip_group(data, pos, end, field, depth + 1)
    else:
        raise WireError("end-group tag outside its group")
    if pos > end:
        raise WireError("truncated fixed-width value")
    return pos


def _skip_group(data: bytes, pos: int, end: int, field: int, depth: int) -> int:
    if depth > MAX_DEPTH:
        raise WireError("groups nested too deep")
    while pos < end:
        inner, wire, pos = tag(data, pos, end)
        if wire == END_GROUP:
            if inner != field:
                raise WireError("end-group tag of another field")
            return pos
        pos = skip(data, pos, end, inner, wire, depth)
    raise WireError("unterminated group")


def text(data: bytes, start: int, stop: int) -> str:
    """The UTF-8 ``string`` field ``data[start:stop]``.

    Raises:
        WireError: the bytes are not valid UTF-8.
    """
    try:
        return data[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a string field is not valid UTF-8") from None


def packed_varints(data: bytes, start: int, stop: int) -> np.ndarray:
    """The varints packed in ``data[start:stop]``, as a uint64 array (one numpy pass per byte of the
    longest varint, no Python loop per element).

    Raises:
        WireError: the last varint is truncated, or one is over 10 bytes.
    """
    raw = np.frombuffer(data, np.uint8, stop - start, start)
    if not raw.size:
        return np.empty(0, np.uint64)
    if raw[-1] >= 0x80:
        raise WireError("truncated packed varint")
    ends = np.flatnonzero(raw < 0x80)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if int((ends - starts).max()) >= 10:
        raise WireError("varint over 10 bytes")
    return varints_at(raw, starts, ends)


def varints_at(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The varints ``raw[starts[i]:ends[i] + 1]`` (bytes as uint8, each varint at most 10 bytes) as
    uint64 values, one numpy pass per byte of the longest."""
    sizes = ends - starts + 1
    values: np.ndarray = (raw[starts] & 0x7F).astype(np.uint64)
    for k in range(1, int(sizes.max()) if sizes.size else 0):
        rows = np.flatnonzero(sizes > k)
        values[rows] |= (raw[starts[rows] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values


def varints(data: bytes, start: int, stop: int) -> np.ndarray | list[int]:
    """The packed varints of ``data[start:stop]`` as unsigned 64-bit values: a list for a short run
    (a shape, a few values: no numpy set-up), else ``packed_varints``'s array.

    Raises:
        WireError: as ``packed_varints``.
    """
    if stop - start > 64:
        return packed_varints(data, start, stop)
    values = []
    while start < stop:
        value, start = varint(data, start, stop)
        values.append(value)
    return values


def encode_varint(value: int) -> bytes:
    """The varint of a non-negative integer under 2**64 (a negative int64 as its two's complement)."""
    value &= MASK64
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = tuple(bytes((i,)) for i in range(0x80))


def key(field: int, wire: int) -> bytes:
    """The tag bytes of ``field`` with wire type ``wire``."""
    return encode_varint(field << 3 | wire)


def delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return key(field, LENGTH) + encode_varint(len(payload)) + payload
