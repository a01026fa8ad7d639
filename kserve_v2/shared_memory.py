"""Triton's system shared memory extension (``extension_shared_memory.md``): registered regions.

A client creates a POSIX shared memory object (``/dev/shm/<key>``), registers ``byte_size``
bytes of it from ``offset`` under a region name, then names the region in an input's or output's
``shared_memory_region`` / ``shared_memory_byte_size`` / ``shared_memory_offset`` parameters.
Every offset and size is checked against the registered range before any access (CVE-2024-0088,
Triton's texts "Invalid offset for shared memory region", "Invalid offset + byte size", "Integer
overflow detected"), and error messages name regions, never keys or paths. Off unless the server
runs with ``--allow-client-shm``.

The client owns the object and may shrink it (``ftruncate``) at any time, so nothing here maps
it: a mapped page past the object's end kills the process with SIGBUS. Inputs are copied out
with ``pread`` and outputs copied in with ``pwrite`` on a descriptor held from registration;
before each, ``fstat`` re-checks that the range still lies inside the object (a shrunken region
is INVALID_ARGUMENT), and a short read (shrunk in between) is INVALID_ARGUMENT too.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from kserve_v2.errors import AlreadyExists, InvalidInput, NotFound

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"/[A-Za-z0-9_.\-]{1,254}")
_UINT64 = 2**64


class _Descriptor:
    """An open descriptor, closed when the last region or range using it is gone (so an
    unregister never closes a descriptor a request in flight still reads or writes)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Region:
    """One registered region: ``byte_size`` bytes of the object ``key`` from ``offset``."""

    name: str
    key: str
    offset: int
    byte_size: int
    descriptor: _Descriptor


@dataclass(frozen=True)
class RegionRange:
    """``byte_size`` bytes at ``offset`` (from the object's start) of a registered region."""

    region: Region
    offset: int
    byte_size: int

    def _check_size(self) -> None:
        size = os.fstat(self.region.descriptor.fd).st_size
        if self.offset + self.byte_size > size:
            raise InvalidInput(f"shared memory region '{self.region.name}' has shrunk: its object no longer "
                               f"holds the {self.byte_size} bytes the request names")

    def read(self) -> bytearray:
        """Copy the range out (``fstat``, then ``pread``).

        Raises:
            InvalidInput: the object shrank below the range -> INVALID_ARGUMENT.
        """
        self._check_size()
        data = bytearray(self.byte_size)
        if self.byte_size and os.preadv(self.region.descriptor.fd, [data], self.offset) != self.byte_size:
            raise InvalidInput(f"shared memory region '{self.region.name}' has shrunk while it was read")
        return data

    def write(self, data: memoryview) -> None:
        """Copy ``data`` (at most ``byte_size`` bytes) to the start of the range (``fstat``, then ``pwrite``).

        Raises:
            InvalidInput: the object shrank below the range -> INVALID_ARGUMENT.
        """
        self._check_size()
        written = 0
        while written < len(data):
            written += os.pwrite(self.region.descriptor.fd, data[written:], self.offset + written)


class SharedMemoryRegistry:
    """The registered system shared memory regions of this server."""

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes of ``/dev/shm/<key>`` from ``offset`` under ``name``.

        Raises:
            InvalidInput: an empty name, a key that is not one POSIX shm name (``/name``), an object
                that cannot be opened as a regular file, or a range beyond its size -> INVALID_ARGUMENT.
            AlreadyExists: ``name`` is registered -> ALREADY_EXISTS.
        """
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if not _KEY.fullmatch(key) or key in ("/.", "/.."):
            raise InvalidInput(f"the key of shared memory region '{name}' must be a POSIX shared memory name "
                               "such as '/input_simple'")
        if offset + byte_size >= _UINT64:
            raise InvalidInput(f"Integer overflow detected for shared memory region '{name}'")
        try:
            fd = os.open(SHM_ROOT / key[1:], os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            raise InvalidInput(f"unable to open the shared memory object of region '{name}'") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
                raise InvalidInput(f"the shared memory object of region '{name}' is not a non-empty memory object")
            if offset + byte_size > info.st_size:
                raise InvalidInput(f"the range of shared memory region '{name}' ({offset} + {byte_size} bytes) "
                                   f"is beyond the {info.st_size}-byte object")
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = Region(name, key, offset, byte_size, _Descriptor(fd))

    def unregister(self, name: str) -> None:
        """Forget ``name`` (every region when empty); an unknown name is not an error (Triton)."""
        if name:
            self._regions.pop(name, None)
        else:
            self._regions.clear()

    def status(self, name: str) -> list[Region]:
        """The regions, or just ``name``.

        Raises:
            NotFound: ``name`` is not registered -> NOT_FOUND.
        """
        if not name:
            return list(self._regions.values())
        if name not in self._regions:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [self._regions[name]]

    def slice(self, name: str, offset: int, byte_size: int) -> RegionRange:
        """``byte_size`` bytes at ``offset`` inside region ``name`` (read or written later, each
        access re-checking the object's size).

        Raises:
            NotFound: an unknown region -> NOT_FOUND.
            InvalidInput: a negative value, an offset outside the region, a range past its end,
                or an overflowing sum -> INVALID_ARGUMENT.
        """
        region = self.status(name)[0]
        if offset < 0 or byte_size < 0:
            raise InvalidInput(f"shared memory offset and byte size must not be negative for region '{name}'")
        if offset + byte_size >= _UINT64:
            raise InvalidInput(f"Integer overflow detected for shared memory region '{name}'")
        if offset >= region.byte_size and not (offset == byte_size == 0):
            raise InvalidInput(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise InvalidInput(f"Invalid offset + byte size for shared memory region: '{name}'")
        return RegionRange(region, region.offset + offset, byte_size)
