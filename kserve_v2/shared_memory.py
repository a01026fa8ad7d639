"""Triton's system shared memory extension (``extension_shared_memory.md``): registered regions.

A client creates a POSIX shared memory object (``/dev/shm/<key>``), registers ``byte_size``
bytes of it from ``offset`` under a region name, then names the region in an input's or output's
``shared_memory_region`` / ``shared_memory_byte_size`` / ``shared_memory_offset`` parameters.
Inputs are read in place (a zero-copy view); outputs are copied into the region. Every offset and
size is checked against the registered range before any access (CVE-2024-0088, Triton's texts
"Invalid offset for shared memory region", "Invalid offset + byte size", "Integer overflow
detected"), and error messages name regions, never keys or paths. Off unless the server runs with
``--allow-client-shm``. Used on the event loop only.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from kserve_v2.errors import AlreadyExists, InvalidInput, NotFound

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"/[A-Za-z0-9_.\-]{1,254}")
_UINT64 = 2**64


@dataclass(frozen=True)
class Region:
    """One registered region: ``byte_size`` bytes of the object ``key`` from ``offset``."""

    name: str
    key: str
    offset: int
    byte_size: int
    view: memoryview


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
            mapping = mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)
        # the mapping stays open while any view of it (an input in flight) is alive
        self._regions[name] = Region(name, key, offset, byte_size, memoryview(mapping)[offset:offset + byte_size])

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

    def slice(self, name: str, offset: int, byte_size: int) -> memoryview:
        """``byte_size`` bytes at ``offset`` inside region ``name`` (a writable view, no copy).

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
        return region.view[offset:offset + byte_size]
