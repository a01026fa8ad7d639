"""malloc on transparent huge pages: when the server asks for them, and what they save per buffer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kserve_v2.host.allocator import HUGE_PAGES, TUNABLES, huge_page_environment, this_host

MADVISE = "always [madvise] never\n"

FAULTS = """
import resource
source = bytearray(16 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
buffers = [bytes(source) for _ in range(4)]  # a request holds several copies of its tensor at once
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_tunable_is_asked_for_where_glibc_and_the_kernel_honour_it() -> None:
    assert huge_page_environment({"PATH": "/bin"}, "glibc 2.36", MADVISE) == {"PATH": "/bin", TUNABLES: HUGE_PAGES}
    assert huge_page_environment({}, "glibc 2.35", MADVISE) == {TUNABLES: HUGE_PAGES}


@pytest.mark.parametrize("environ, glibc, thp_mode", [
    ({TUNABLES: "glibc.malloc.trim_threshold=0"}, "glibc 2.36", MADVISE),  # the user's own tunables win
    ({}, "glibc 2.34", MADVISE),  # no hugetlb tunable before 2.35
    ({}, "glibc 2.x", MADVISE),
    ({}, "", MADVISE),  # musl, macOS
    ({}, "glibc 2.36", "[always] madvise never\n"),  # every mapping gets them already
    ({}, "glibc 2.36", "always madvise [never]\n"),
    ({}, "glibc 2.36", ""),  # no such kernel setting
])
def test_nothing_is_changed_where_there_is_nothing_to_gain(environ: dict[str, str], glibc: str, thp_mode: str) -> None:
    assert huge_page_environment(environ, glibc, thp_mode) is None


def _faults(environ: dict[str, str]) -> int:
    return int(subprocess.run([sys.executable, "-c", FAULTS], env=environ, capture_output=True, text=True,
                              check=True).stdout)


def test_huge_pages_fault_a_16_mib_buffer_in_a_few_times_instead_of_4096() -> None:
    environment = huge_page_environment({k: v for k, v in os.environ.items() if k != TUNABLES}, *this_host())
    if environment is None:
        pytest.skip(f"this host gives no huge pages on request: {this_host()}")
    assert _faults(environment) < 4 * 4096 // 4  # 4 x 16 MiB is 16,384 pages of 4 KiB, 32 huge pages
    assert _faults({k: v for k, v in os.environ.items() if k != TUNABLES}) > 4 * 4096 // 2
