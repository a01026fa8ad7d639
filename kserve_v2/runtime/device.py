"""Quiet CUDA detection: is there a GPU that ONNX Runtime's CUDA execution provider can use?

Asking ONNX Runtime directly prints provider-load errors on CPU hosts, so this asks the CUDA
driver (``libcuda.so.1``) for a device count first and only then looks at ORT's providers.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import onnxruntime as ort

log = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"
OPENVINO = "openvino"  # its name as a cpu_execution_accelerator (Triton's onnxruntime backend)


@functools.cache
def cuda_device_count() -> int:
    """Number of CUDA devices usable by ORT's CUDA execution provider; 0 on CPU hosts."""
    if CUDA_EP not in ort.get_available_providers():
        return 0
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    if count.value:
        try:  # load the CUDA/cuDNN libraries shipped as pip packages, when present
            ort.preload_dlls()
        except Exception as err:  # noqa: BLE001 - best effort; the session reports real failures
            log.debug("onnxruntime.preload_dlls failed: %s", err)
    return count.value
