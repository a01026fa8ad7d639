"""Triton's system shared memory extension (``extension_shared_memory.md``): registered regions.

A client creates a POSIX shared memory object (``/dev/shm/<key>``), registers ``byte_size``
bytes of it from ``offset`` under a region name, then names the region in an input's or output's
``shared_memory_region`` / ``shared_memory_byte_size`` / ``shared_memory_offset`` parameters.
Every offset and size is checked against the registered range before any access (CVE-2024-0088,
Triton's texts "Invalid offset for shared memory region", "Invalid offset + byte size", "Integer
overflow detected"), and error messages name regions and the client's own key, never paths. Off
unless the server runs with ``--allow-client-shm``.

A request holds every region it names, inputs and outputs, from its decoding until its response
is written (``RequestRegions``); a held region cannot be unregistered, as in Triton
(``src/shared_memory_manager.cc``: "Cannot unregister shared memory region '<name>', it is
currently in use.").

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
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kserve_v2.protocol.errors import AlreadyExists, Cancelled, InternalError, InvalidInput, NotFound

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


@dataclass(eq=False)
class Region:
    """One registered region: ``byte_size`` bytes of the object ``key`` from ``offset``;
    ``users``: requests in flight that hold it (see ``RequestRegions``)."""

    name: str
    key: str
    offset: int
    byte_size: int
    descriptor: _Descriptor = field(repr=False)
    users: int = 0


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
    """The registered system shared memory regions of this server.

    Registration and unregistration run on the event loop; a request may take its regions on a
    decode thread, so holding a region and unregistering it are serialised by ``lock``.
    """

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}
        self.lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes of ``/dev/shm/<key>`` from ``offset`` under ``name`` (Triton's texts).

        Raises:
            AlreadyExists: ``name`` is registered -> ALREADY_EXISTS.
            InternalError: a key that names no openable POSIX shared memory object (``/name``; an
                empty key too): "Unable to open shared memory region: '<key>'"; an object that is not
                a regular file: "Invalid shared memory region: '<key>'" -> INTERNAL.
            InvalidInput: an empty name; an offset and size beyond the object ("failed to register
                shared memory region '<name>': invalid args") or past 2^64 -> INVALID_ARGUMENT.
        """
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        fd = self._open(key)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InternalError(f"Invalid shared memory region: '{key}'")
            if not name:  # Triton would register it, but a nameless region could only be named as "all of them"
                raise InvalidInput("a shared memory region needs a name")
            if offset + byte_size >= _UINT64:
                raise InvalidInput(f"Integer overflow detected for shared memory region '{name}'")
            if offset + byte_size > info.st_size or info.st_size == 0:
                raise InvalidInput(f"failed to register shared memory region '{name}': invalid args")
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = Region(name, key, offset, byte_size, _Descriptor(fd))

    @staticmethod
    def _open(key: str) -> int:
        """A descriptor of the POSIX shared memory object ``key`` (``shm_open``'s naming: one ``/name``).

        Raises:
            InternalError: "Unable to open shared memory region: '<key>'" -> INTERNAL.
        """
        if _KEY.fullmatch(key) and key not in ("/.", "/.."):
            try:
                return os.open(SHM_ROOT / key[1:], os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                pass
        raise InternalError(f"Unable to open shared memory region: '{key}'")

    def unregister(self, name: str) -> None:
        """Forget ``name`` (every region when empty); an unknown name is not an error (Triton).

        Raises:
            InternalError: the region is held by a request in flight: "Cannot unregister shared
                memory region '<name>', it is currently in use."; for every region, the others are
                unregistered and the held ones named: "Failed to unregister the following system
                shared memory regions: <a> ,<b> ," -> INTERNAL (Triton's texts).
        """
        with self.lock:
            if name:
                region = self._regions.get(name)
                if region is not None and region.users:
                    raise InternalError(f"Cannot unregister shared memory region '{name}', it is currently in use.")
                self._regions.pop(name, None)
                return
            held = sorted(n for n, region in self._regions.items() if region.users)
            self._regions = {n: self._regions[n] for n in held}
        if held:
            raise InternalError("Failed to unregister the following system shared memory regions: "
                                + "".join(f"{n} ," for n in held))

    def status(self, name: str) -> list[Region]:
        """The regions, or just ``name``.

        Raises:
            NotFound: ``name`` is not registered -> NOT_FOUND.
        """
        if not name:
            return list(self._regions.values())
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region]

    def request(self) -> RequestRegions:
        """A request's view of the regions: what it names is held until ``RequestRegions.release``."""
        return RequestRegions(self)

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
        if offset >= region.byte_size and not (offset == byte_size == 0):  # first, as Triton checks
            raise InvalidInput(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size >= _UINT64:
            raise InvalidInput(f"Integer overflow detected for shared memory region '{name}'")
        if offset + byte_size > region.byte_size:
            raise InvalidInput(f"Invalid offset + byte size for shared memory region: '{name}'")
        return RegionRange(region, region.offset + offset, byte_size)


class RequestRegions:
    """The regions one request reads or writes: each range it takes holds its region (it cannot be
    unregistered) until ``release``, which the request calls once its response is written or it
    failed. Ranges may be taken on a decode thread; after ``release`` (a cancelled request whose
    decoding goes on) none is taken any more."""

    __slots__ = ("_held", "_registry")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._held: list[Region] | None = []

    def slice(self, name: str, offset: int, byte_size: int) -> RegionRange:
        """``SharedMemoryRegistry.slice``, holding the region for this request (same errors).

        Raises:
            Cancelled: the request was released (it ended while this ran on a thread) -> CANCELLED.
        """
        with self._registry.lock:
            if self._held is None:
                raise Cancelled("the request ended before its shared memory was read")
            taken = self._registry.slice(name, offset, byte_size)
            taken.region.users += 1
            self._held.append(taken.region)
            return taken

    def release(self) -> None:
        """Let go of every region this request holds; no range is taken afterwards."""
        with self._registry.lock:
            for region in self._held or ():
                region.users -= 1
            self._held = None
