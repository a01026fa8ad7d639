"""The process's memory allocator: tensor-sized buffers on transparent huge pages.

Every large tensor passes through several fresh buffers per request (gRPC's receive buffer, the
parsed message, the bytes read out of it, the output, the response and its send buffer). glibc
malloc serves each from fresh pages, and with 4 KiB pages a fault costs about a microsecond
here: a 16 MiB copy into fresh pages took 5.3 ms, into huge pages 2 ms. glibc (2.35 and later)
asks the kernel for transparent huge pages for what it maps when the ``glibc.malloc.hugetlb``
tunable is 1 (glibc's manual, "Memory Allocation Tunables"); tunables are read only when a
process starts, so the command line starts itself once more with it. Measured in one sitting:
FP32 identity 16 MiB over gRPC from 8.3 to 11.3-11.9 infer/s, with the same peak and idle RSS.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"
# the kernel's transparent huge page mode: "madvise" gives them to whoever asks, "always" to everyone
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_page_environment(environ: Mapping[str, str], glibc: str, thp_mode: str) -> dict[str, str] | None:
    """The environment to run the server in so that malloc asks for huge pages, or None when there is
    nothing to gain: a user who set ``GLIBC_TUNABLES`` keeps it, glibc before 2.35 has no such
    tunable, and the kernel gives huge pages only in its ``[madvise]`` mode on request (``[always]``
    needs no request, ``[never]`` gives none).

    ``glibc`` is ``os.confstr("CS_GNU_LIBC_VERSION")`` ("glibc 2.36", or "" elsewhere); ``thp_mode``
    the text of ``/sys/kernel/mm/transparent_hugepage/enabled``. Raises nothing.
    """
    if TUNABLES in environ or "[madvise]" not in thp_mode:
        return None
    name, _, version = glibc.partition(" ")
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    if name != "glibc" or (major, minor) < (2, 35):
        return None
    return {**environ, TUNABLES: HUGE_PAGES}


def this_host() -> tuple[str, str]:
    """(glibc's version text, the transparent huge page mode) of this host; empty texts where unknown."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not glibc: musl and macOS have no such name
        glibc = ""
    try:
        thp_mode = THP_MODE.read_text()
    except OSError:
        thp_mode = ""
    return glibc, thp_mode
