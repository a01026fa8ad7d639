"""The shared memory region through which a python model instance run in a process of its own
(``EXECUTION_MODE`` ``process``, ``kserve_v2.runtime.python.process``) and the server exchange
tensors: only names, datatypes, shapes and offsets travel over the pipe, the data stays here.

A region is a file in ``/dev/shm`` (``<shm-region-prefix-name><model>_<instance>_<pid>``, Triton's
python backend settings), mapped by both processes. Tensors are packed one after another from an
offset, each aligned to 64 bytes; a BYTES tensor is written in Triton's length-prefixed form (each
element as a 4-byte little-endian length and its bytes). A region too small for what must be
written grows: to ``shm-default-byte-size`` plus as many ``shm-growth-byte-size`` steps as needed.
Either side may grow it; the size travels with each message, and the other side maps it again when
it sees a larger one.

Only numpy and the standard library are imported here (the stub process stays light).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

ALIGN = 64
SHM_DIR = "/dev/shm"
BYTES = "BYTES"  # the dtype text of a BYTES (object) tensor in a descriptor


@dataclass(frozen=True, slots=True)
class Sizes:
    """Triton's python backend shared memory settings (``--backend-config=python,<key>=<value>``).

    Attributes:
        default_byte_size: a region's first size (``shm-default-byte-size``, bytes; Triton's default 1 MiB).
        growth_byte_size: the step a region grows by (``shm-growth-byte-size``, bytes; 1 MiB).
        prefix: the start of a region's name in ``/dev/shm`` (``shm-region-prefix-name``).
    """

    default_byte_size: int = 1 << 20
    growth_byte_size: int = 1 << 20
    prefix: str = "triton_python_backend_shm_region_"

    def fitting(self, current: int, needed: int) -> int:
        """The size a region of ``current`` bytes must have to hold ``needed`` bytes (``current`` when it does)."""
        if needed <= current:
            return current
        steps = -(-(needed - self.default_byte_size) // self.growth_byte_size)
        return max(current, self.default_byte_size + max(steps, 0) * self.growth_byte_size)


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one tensor lies in a region: its name, numpy dtype text (``BYTES`` for a BYTES tensor),
    shape, byte offset and byte length."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def __reduce__(self) -> tuple[type[Slot], tuple[str, str, tuple[int, ...], int, int]]:
        """Pickled as its fields (faster than the dataclasses' own pickling of frozen slotted classes)."""
        return Slot, (self.name, self.dtype, self.shape, self.offset, self.nbytes)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def encoded(array: np.ndarray) -> bytes | np.ndarray:
    """What a tensor's array is written as: a BYTES (object, ``bytes`` or ``str``) array in Triton's
    length-prefixed form (``str`` elements as UTF-8), any other as itself (C order)."""
    if array.dtype.kind not in "OSU":
        return np.ascontiguousarray(array)
    parts = []
    for item in array.reshape(-1).tolist():
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def decoded(data: memoryview, count: int) -> np.ndarray:
    """The ``count`` elements of length-prefixed BYTES ``data``, as a 1-D object array of ``bytes``.

    Raises:
        ValueError: ``data`` does not hold ``count`` framed elements.
    """
    items, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(data):
            raise ValueError("a BYTES tensor in shared memory is shorter than its shape")
        (length,) = struct.unpack_from("<I", data, offset)
        items.append(bytes(data[offset + 4 : offset + 4 + length]))
        offset += 4 + length
    result = np.empty(count, dtype=np.object_)
    result[:] = items
    return result


class Region:
    """One instance's shared memory region, mapped in this process.

    Args:
        name: the file's name in ``/dev/shm``.
        size: its size; with ``create``, the file is made (or truncated) to it.
        create: make the file (the server's side) rather than open the existing one (the stub's side).
    """

    def __init__(self, name: str, size: int, create: bool = False) -> None:
        self.name = name
        self._path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        self._fd = os.open(self._path, flags, 0o600)
        if create:
            os.ftruncate(self._fd, size)
        self.size = 0
        self._map: mmap.mmap | None = None
        self.remap(size)

    def remap(self, size: int) -> None:
        """Map the region again at ``size`` bytes, when it grew beyond what is mapped (the other side
        grew it). Arrays over the former mapping stay valid (it closes with its last view)."""
        if size > self.size:
            self._map = mmap.mmap(self._fd, size)
            self.size = size

    def grow(self, needed: int, sizes: Sizes) -> None:
        """Make the region hold ``needed`` bytes (``Sizes.fitting``) and map it so."""
        size = sizes.fitting(self.size, needed)
        if size > self.size:
            os.ftruncate(self._fd, size)
            self.remap(size)

    def write(self, named: list[tuple[str, np.ndarray]], offset: int, sizes: Sizes) -> list[Slot]:
        """Write ``named`` arrays from ``offset`` on (growing the region when they do not fit); their slots."""
        data = [(name, array, encoded(array)) for name, array in named]
        end, places = offset, []
        for _, _, body in data:
            start = _aligned(end)
            places.append(start)
            end = start + (body.nbytes if isinstance(body, np.ndarray) else len(body))
        self.grow(end, sizes)
        assert self._map is not None
        slots = []
        for (name, array, body), start in zip(data, places, strict=True):
            raw = body.reshape(-1).view(np.uint8).data if isinstance(body, np.ndarray) else memoryview(body)
            self._map[start : start + len(raw)] = raw
            dtype = BYTES if array.dtype.kind in "OSU" else array.dtype.str
            slots.append(Slot(name, dtype, tuple(array.shape), start, len(raw)))
        return slots

    def end(self, slots: list[Slot], offset: int = 0) -> int:
        """Where free space starts after ``slots`` (and ``offset``)."""
        return _aligned(max([offset, *(slot.offset + slot.nbytes for slot in slots)]))

    def read(self, slot: Slot, copy: bool = False) -> np.ndarray:
        """The array in ``slot``: a writable view of the region (``copy``: an array of its own); BYTES
        tensors are always decoded into an object array of ``bytes``.

        Raises:
            ValueError: a slot outside the region.
        """
        if slot.offset + slot.nbytes > self.size:
            raise ValueError(f"tensor '{slot.name}' lies outside the shared memory region '{self.name}'")
        assert self._map is not None
        view = memoryview(self._map)[slot.offset : slot.offset + slot.nbytes]
        count = math.prod(slot.shape)
        if slot.dtype == BYTES:
            return decoded(view, count).reshape(slot.shape)
        array = np.frombuffer(view, dtype=np.dtype(slot.dtype), count=count).reshape(slot.shape)
        return array.copy() if copy else array

    def close(self, unlink: bool = False) -> None:
        """Close this side's file (``unlink``: remove it from ``/dev/shm`` too); views stay valid until dropped."""
        os.close(self._fd)
        self._map = None
        if unlink:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
