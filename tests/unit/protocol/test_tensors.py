"""Tensor codecs (kserve_v2.protocol.tensors): raw contents, typed contents and BYTES framing."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kserve_v2.protocol import tensors
from kserve_v2.protocol.datatypes import BF16, BY_V2, BYTES
from kserve_v2.protocol.errors import ErrorCode, InvalidInput

WHAT = "input 'INPUT0'"


def framed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_element_count() -> None:
    assert tensors.element_count([2, 3, 4], WHAT) == 24
    assert tensors.element_count([], WHAT) == 1
    assert tensors.element_count([5, 0], WHAT) == 0
    with pytest.raises(InvalidInput, match="invalid dim -1"):
        tensors.element_count([2, -1], WHAT)
    with pytest.raises(InvalidInput, match="integer overflow"):
        tensors.element_count([2**32, 2**32], WHAT)


def test_from_raw_is_a_read_only_view() -> None:
    raw = np.arange(6, dtype="<i4").tobytes()
    array = tensors.from_raw(raw, BY_V2["INT32"], [2, 3], WHAT)
    assert array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not array.flags.writeable


def test_from_raw_checks_the_byte_size() -> None:
    with pytest.raises(InvalidInput, match="input byte size mismatch.*Expected 24, got 20") as caught:
        tensors.from_raw(b"\0" * 20, BY_V2["FP32"], [2, 3], WHAT)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_from_contents_widened_and_overflowing() -> None:
    array = tensors.from_contents([1, -2, 127, -128], BY_V2["INT8"], [2, 2], WHAT)
    assert array.dtype == np.int8 and array.tolist() == [[1, -2], [127, -128]]
    with pytest.raises(InvalidInput, match="do not fit datatype UINT8"):
        tensors.from_contents([256], BY_V2["UINT8"], [1], WHAT)
    with pytest.raises(InvalidInput, match="expected 4, got 3"):
        tensors.from_contents([1, 2, 3], BY_V2["INT32"], [2, 2], WHAT)
    text = tensors.from_contents([b"a", b""], BYTES, [2], WHAT)
    assert text.dtype == object and text.tolist() == [b"a", b""]


def test_bytes_framing_round_trip_keeps_nuls_and_utf8() -> None:
    array = np.array([[b"a\x00b", b""], ["é", b"end"]], dtype=object)
    buf = tensors.pack_bytes(array)
    assert buf == framed(b"a\x00b", b"", "é".encode(), b"end")
    assert tensors.unpack_bytes(buf, 4, WHAT).tolist() == [b"a\x00b", b"", "é".encode(), b"end"]
    assert tensors.from_raw(buf, BYTES, [2, 2], WHAT).shape == (2, 2)
    assert tensors.to_raw(array, BYTES) == buf
    assert tensors.pack_bytes(np.array([], dtype=object)) == b""


def test_bytes_framing_across_blocks_and_long_elements() -> None:
    """More elements than one framing block, lengths past the shared prefixes (1024 and up)."""
    items = [bytes([i % 251]) * (i % 1500) for i in range(70_000)] + ["ü" * 700]
    array = np.empty(len(items), dtype=object)
    array[:] = items
    encoded = [*items[:-1], "ü".encode() * 700]
    buf = tensors.pack_bytes(array)
    assert buf == framed(*encoded)
    assert tensors.unpack_bytes(buf, len(items), WHAT).tolist() == encoded


@pytest.mark.parametrize(("buf", "count", "message"), [
    # too few elements for the count (refused before allocating), more: Triton's texts
    (framed(b"ab"), 2, "^expected 2 string elements for inference input 'INPUT0', got 1$"),
    (framed(b"a", b"b"), 1, "^unexpected number of string elements 2 for inference input 'INPUT0', expecting 1$"),
    (framed(b"a", b"b", b""), 4, "^expected 4 string elements for inference input 'INPUT0', got 3$"),
    (b"\0" * 4000, 10**6, "expected 1000000 string elements for inference .*, got 1000$"),  # far beyond the buffer
    (framed(b"ab") + b"\x01\x00", 2, "truncated length prefix"),
    (framed(b"abcd") + b"\x01\x00\x00", 2, "truncated length prefix"),
    (struct.pack("<I", 10) + b"abc", 1, "past the end of the buffer"),
])
def test_malformed_bytes_framing(buf: bytes, count: int, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        tensors.unpack_bytes(buf, count, WHAT)


def test_to_raw_is_little_endian_row_major() -> None:
    array = np.array([[1, 2], [3, 4]], dtype=">i4").T  # big-endian and not C-contiguous
    assert tensors.to_raw(array, BY_V2["INT32"]) == np.array([1, 3, 2, 4], dtype="<i4").tobytes()
    bf16 = np.array([1.5, -2.0], dtype=BF16.numpy)
    assert tensors.to_raw(bf16, BF16) == bf16.view(np.uint16).astype("<u2").tobytes()
    assert tensors.from_raw(tensors.to_raw(bf16, BF16), BF16, [2], WHAT).tolist() == [1.5, -2.0]


def test_as_buffer_views_large_outputs_and_gives_to_raws_bytes() -> None:
    large = np.arange(tensors.COPY_BELOW, dtype="<i4").reshape(2, -1)
    view = tensors.as_buffer(large, BY_V2["INT32"])
    assert isinstance(view, memoryview) and np.shares_memory(np.frombuffer(view, np.uint8), large)
    for array, dtype in ((large, BY_V2["INT32"]), (large.T, BY_V2["INT32"]), (large.astype(">i4"), BY_V2["INT32"]),
                         (np.arange(3, dtype="<f4"), BY_V2["FP32"]), (np.array([1.5], BF16.numpy), BF16)):
        assert bytes(tensors.as_buffer(array, dtype)) == tensors.to_raw(array, dtype)


def test_from_contents_takes_the_codecs_arrays_with_the_same_checks() -> None:
    narrow = tensors.from_contents(np.array([1, -2, 127, -128], np.int32), BY_V2["INT8"], [2, 2], WHAT)
    assert narrow.dtype == np.int8 and narrow.tolist() == [[1, -2], [127, -128]]
    with pytest.raises(InvalidInput, match="do not fit datatype UINT8: Python integer 256 out of bounds for uint8"):
        tensors.from_contents(np.array([1, 256], np.uint32), BY_V2["UINT8"], [2], WHAT)
    assert tensors.from_contents(np.array([0.5], np.float32), BY_V2["FP32"], [1], WHAT).dtype == np.float32
