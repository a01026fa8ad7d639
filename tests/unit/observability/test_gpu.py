"""Which of NVML's GPUs CUDA_VISIBLE_DEVICES leaves visible (kserve_v2.observability.gpu.visible_gpus): the GPU
metrics and the status page report those alone, as Triton does."""

from __future__ import annotations

import pytest

from kserve_v2.observability.gpu import visible_gpus

UUIDS = ["GPU-1a2b3c4d-0000-0000-0000-000000000000", "GPU-1a2b9999-0000-0000-0000-000000000000",
         "GPU-77777777-0000-0000-0000-000000000000", "GPU-88888888-0000-0000-0000-000000000000"]


@pytest.mark.parametrize(("cuda_visible", "expected"), [
    (None, [0, 1, 2, 3]),  # unset: every GPU
    ("2", [2]),
    ("3,1", [3, 1]),  # CUDA's order is the variable's
    ("1, 2", [1, 2]),
    ("", []),  # set and empty: none
    ("-1", []),
    ("0,-1,2", [0]),  # the list ends at the first entry that names no GPU
    ("1,7,2", [1]),  # past the last GPU
    ("2,2,3", [2]),  # named twice
    ("GPU-77777777-0000-0000-0000-000000000000,0", [2, 0]),
    ("gpu-8888", [3]),  # a unique prefix, any case
    ("GPU-1a2b,3", []),  # a prefix of two GPUs names neither
    ("GPU-1a2b9,3", [1, 3]),
    ("MIG-4f5e6d7c-0000-0000-0000-000000000000", []),
])
def test_cuda_visible_devices_as_cuda_reads_it(cuda_visible: str | None, expected: list[int]) -> None:
    assert visible_gpus(UUIDS, cuda_visible) == expected


def test_no_gpus() -> None:
    assert visible_gpus([], None) == [] and visible_gpus([], "0") == []
