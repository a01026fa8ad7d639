"""The shared memory layout of python models run in stub processes (``kserve_v2.runtime.python.shm``):
tensors packed and aligned, BYTES in Triton's length-prefixed form, growth by Triton's settings, a
second mapping that sees what the first wrote, and the ``EXECUTION_MODE`` parameter."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from kserve_v2.runtime.python.shm import ALIGN, BYTES, Region, Sizes, encoded

SIZES = Sizes(default_byte_size=4096, growth_byte_size=1024, prefix="unused_")


@pytest.fixture()
def region() -> Iterator[Region]:
    made = Region(f"kserve_v2_unit_shm_{os.getpid()}", SIZES.default_byte_size, create=True)
    yield made
    made.close(unlink=True)


def test_growth_is_the_default_size_plus_whole_growth_steps() -> None:
    assert SIZES.fitting(4096, 100) == 4096
    assert SIZES.fitting(4096, 4097) == 5120
    assert SIZES.fitting(4096, 6145) == 7168
    assert SIZES.fitting(8192, 6000) == 8192  # never shrinks


def test_tensors_are_packed_aligned_and_read_back(region: Region) -> None:
    arrays = [("f", np.arange(6, dtype=np.float32).reshape(2, 3)), ("b", np.array([True, False])),
              ("e", np.zeros((0, 4), np.int64)), ("h", np.array([1.5], np.float16))]
    slots = region.write(arrays, 10, SIZES)
    assert [s.offset % ALIGN for s in slots] == [0] * 4 and slots[0].offset == ALIGN
    assert [s.dtype for s in slots] == ["<f4", "|b1", "<i8", "<f2"]
    for (_, array), slot in zip(arrays, slots, strict=True):
        read = region.read(slot)
        assert read.dtype == array.dtype and read.shape == array.shape
        np.testing.assert_array_equal(read, array)
    assert region.end(slots) >= slots[-1].offset + slots[-1].nbytes


def test_bytes_tensors_travel_in_tritons_length_prefixed_form(region: Region) -> None:
    array = np.array([[b"ab", b""], ["c\u00e9", b"xyz"]], dtype=np.object_)
    assert encoded(array) == b"".join(struct.pack("<I", len(x)) + x for x in (b"ab", b"", "c\u00e9".encode(), b"xyz"))
    (slot,) = region.write([("s", array)], 0, SIZES)
    assert slot.dtype == BYTES and slot.shape == (2, 2)
    assert region.read(slot).tolist() == [[b"ab", b""], ["c\u00e9".encode(), b"xyz"]]


def test_a_write_larger_than_the_region_grows_it_and_the_other_side_maps_it_again(region: Region) -> None:
    other = Region(region.name, region.size)
    try:
        big = np.arange(3000, dtype=np.float32)  # 12000 bytes: 4096 + 8 steps of 1024
        (slot,) = region.write([("big", big)], 0, SIZES)
        assert region.size == 12288 and os.path.getsize(f"/dev/shm/{region.name}") == 12288
        with pytest.raises(ValueError, match="outside the shared memory region"):
            other.read(slot)
        other.remap(region.size)
        copied = other.read(slot, copy=True)
        region.write([("big", np.zeros(3000, np.float32))], 0, SIZES)
        np.testing.assert_array_equal(copied, big)  # a copy does not change with the region
        np.testing.assert_array_equal(other.read(slot), np.zeros(3000, np.float32))  # a view does
    finally:
        other.close()


def test_the_stub_imports_neither_grpc_nor_onnxruntime_nor_the_server() -> None:
    code = ("import sys, kserve_v2.runtime.python.stub\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'onnxruntime', 'uvloop', 'uvicorn'}),"
            " 'kserve_v2.app' in sys.modules, 'kserve_v2.runtime.onnx' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["[]", "False", "False"], done.stdout + done.stderr
