"""Tensor bytes <-> numpy arrays: raw contents, typed contents and BYTES framing.

The one place that turns protocol tensor data into ``np.ndarray`` and back. Raw numeric data
becomes a read-only ``np.frombuffer`` view with no copy. Every count and size is checked against
the declared shape before anything is allocated, with the messages of Triton's input checks
(Triton's ``qa/L0_input_validation`` tests): overflowing shapes, compromised byte sizes, truncated
or flooding BYTES prefixes.

BYTES framing (Triton's ``grpc_service.proto``, ``raw_input_contents``): each element, in row-major
order, is a 4-byte little-endian unsigned length followed by that many bytes; embedded NULs
are data. Decoded BYTES tensors are numpy ``object`` arrays of ``bytes``.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence

import numpy as np

from kserve_v2.protocol.datatypes import BF16, BYTES, DType
from kserve_v2.protocol.errors import InvalidInput

_INT64_MAX = 2**63 - 1
RawBytes = bytes | bytearray | memoryview  # a raw contents entry: the message's bytes, a shared memory read, a body slice
_LEN = struct.Struct("<I")
_PREFIXES = tuple(_LEN.pack(length) for length in range(1024))
_PACK_BLOCK = 1 << 16  # elements framed per join
COPY_BELOW = 1 << 12  # bytes: a smaller output is copied rather than viewed (``as_buffer``)
_LITTLE_ENDIAN = sys.byteorder == "little"


def element_count(shape: Sequence[int], what: str) -> int:
    """Number of elements of a request shape.

    Args:
        shape: dims as sent by the client; each must be >= 0.
        what: the tensor's description for messages (``"input 'INPUT0' for model 'simple'"``).

    Raises:
        InvalidInput: a negative dim (Triton: "contains an invalid dim") or a product above
            int64 (Triton: "unexpected integer overflow") -> INVALID_ARGUMENT.
    """
    count = 1
    for dim in shape:
        if dim < 0:
            raise InvalidInput(f"shape {list(shape)} of {what} contains an invalid dim {dim}")
        count *= dim
        if count > _INT64_MAX:
            raise InvalidInput(
                f"unexpected integer overflow: element count of {what} with shape {list(shape)}"
            )
    return count


def from_raw(raw: RawBytes, dtype: DType, shape: Sequence[int], what: str) -> np.ndarray:
    """Decode one entry of ``raw_input_contents`` into an array of ``shape``.

    Numeric types are a zero-copy, read-only view of ``raw``; BYTES are decoded element by
    element (see ``unpack_bytes``).

    Raises:
        InvalidInput: byte size differs from shape x itemsize (Triton: "input byte size
            mismatch"), or malformed BYTES framing -> INVALID_ARGUMENT.
    """
    count = element_count(shape, what)
    if dtype is BYTES:
        return unpack_bytes(raw, count, what).reshape(shape)
    expected = count * dtype.itemsize
    if expected > _INT64_MAX:
        raise InvalidInput(f"byte size overflow for {what} with shape {list(shape)}")
    if len(raw) != expected:
        raise InvalidInput(f"input byte size mismatch for {what}. Expected {expected}, got {len(raw)}")
    return np.frombuffer(raw, dtype=dtype.numpy).reshape(shape)


def from_contents(values: Sequence[object] | np.ndarray, dtype: DType, shape: Sequence[int], what: str) -> np.ndarray:
    """Decode a typed ``InferTensorContents`` field (already chosen for ``dtype``): a numpy array of
    the field's type as the codec gives it, or a sequence of values.

    Narrow types (INT8/16, UINT8/16) arrive widened in int32/uint32 fields, as Triton accepts them.

    Raises:
        InvalidInput: element count differs from the shape, or a value does not fit the
            datatype -> INVALID_ARGUMENT.
    """
    count = element_count(shape, what)
    if len(values) != count:
        raise InvalidInput(
            f"unexpected number of elements in contents of {what}: expected {count}, got {len(values)}"
        )
    if dtype is BYTES:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    if isinstance(values, np.ndarray) and (values.dtype == dtype.numpy or np.can_cast(values, dtype.numpy)
                                           or _fits(values, dtype.numpy)):
        return values.astype(dtype.numpy).reshape(shape)
    try:  # values as Python numbers: a value out of range raises numpy's own text
        return np.fromiter(values.tolist() if isinstance(values, np.ndarray) else values, dtype=dtype.numpy,
                           count=count).reshape(shape)
    except (OverflowError, ValueError) as err:
        raise InvalidInput(f"contents of {what} do not fit datatype {dtype.v2}: {err}") from None


def _fits(values: np.ndarray, target: np.dtype) -> bool:
    """Whether integer ``values`` all lie in the range of the integer type ``target``."""
    if values.dtype.kind not in "iu" or target.kind not in "iu" or not values.size:
        return not values.size
    limits = np.iinfo(target)
    return bool(limits.min <= values.min() and values.max() <= limits.max)


def unpack_bytes(buf: RawBytes, count: int, what: str) -> np.ndarray:
    """Split a length-prefixed BYTES buffer into ``count`` elements (a 1-D object array).

    The element count is bounded by the buffer (each element takes at least 4 bytes) before
    anything is allocated, so a flood of zero-length prefixes cannot expand memory.

    Raises:
        InvalidInput: -> INVALID_ARGUMENT. When the shape and the data disagree, Triton's texts
            (``ValidateBytesInputs`` of Triton's core, ``qa/L0_input_validation``): fewer elements
            than the shape, "expected <count> string elements for inference <what>, got <found>";
            more, "unexpected number of string elements <count + 1> for inference <what>,
            expecting <count>". A truncated prefix, or a length past the end of the buffer, is
            named as such.
    """
    size = len(buf)
    if count > size // _LEN.size:  # the buffer cannot hold them: count what it holds, as Triton's walk does
        raise InvalidInput(f"expected {count} string elements for inference {what}, got {_held(buf, count, what)}")
    out = np.empty(count, dtype=object)
    view = memoryview(buf)
    offset = 0
    for i in range(count):
        if offset == size:
            raise InvalidInput(f"expected {count} string elements for inference {what}, got {i}")
        if offset + _LEN.size > size:
            raise InvalidInput(f"expected {count} string elements for {what}, got {i} (truncated length prefix)")
        (length,) = _LEN.unpack_from(buf, offset)
        offset += _LEN.size
        if offset + length > size:
            raise InvalidInput(
                f"string element {i} of {what} has length {length} past the end of the buffer"
            )
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != size:
        raise InvalidInput(f"unexpected number of string elements {count + 1} for inference {what}, expecting {count}")
    return out


def _held(buf: RawBytes, count: int, what: str) -> int:
    """How many elements ``buf`` holds (the last may run past its end, as Triton's walk counts it).

    Raises:
        InvalidInput: a truncated length prefix.
    """
    size = len(buf)
    offset = found = 0
    while offset < size:
        if offset + _LEN.size > size:
            raise InvalidInput(f"expected {count} string elements for {what}, got {found} (truncated length prefix)")
        offset += _LEN.size + _LEN.unpack_from(buf, offset)[0]
        found += 1
    return found


def pack_bytes(array: np.ndarray) -> bytes:
    """Frame a BYTES tensor (elements ``bytes`` or ``str``, UTF-8 encoded) with length prefixes.

    Built by joining each element after its prefix, block by block (the prefixes of lengths
    under 1024 are shared objects): beyond the result, what this holds at once is one block's
    parts and the joined blocks, about the framed size again, whatever the element count.
    """
    flat = array.reshape(-1)
    blocks = []
    for start in range(0, flat.size, _PACK_BLOCK):
        parts: list[bytes] = []
        append = parts.append
        for item in flat[start : start + _PACK_BLOCK].tolist():
            if type(item) is not bytes:
                item = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            length = len(item)
            append(_PREFIXES[length] if length < len(_PREFIXES) else _LEN.pack(length))
            append(item)
        blocks.append(b"".join(parts))
    return blocks[0] if len(blocks) == 1 else b"".join(blocks)


def to_raw(array: np.ndarray, dtype: DType) -> bytes:
    """Encode an output array as one ``raw_output_contents`` entry (row-major, little-endian)."""
    if dtype is BYTES:
        return pack_bytes(array)
    return _row_major_le(array, dtype).tobytes()


def as_buffer(array: np.ndarray, dtype: DType) -> bytes | memoryview:
    """The bytes ``to_raw`` gives, as a view of the array's own buffer when it is already
    row-major and little-endian (no copy; an array under ``COPY_BELOW`` bytes is copied, which costs
    less than making a view); BYTES are framed into new bytes."""
    if dtype is BYTES:
        return pack_bytes(array)
    if array.nbytes < COPY_BELOW and _LITTLE_ENDIAN and array.dtype.byteorder != ">":
        return array.tobytes()
    return _row_major_le(array, dtype).reshape(-1).view(np.uint8).data


def _row_major_le(array: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is BF16:
        array = array.view(np.uint16)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
