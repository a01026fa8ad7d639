"""The one datatype table: V2 datatype <-> numpy dtype <-> config enum <-> ONNX type <-> contents field.

Every other module derives its lookups from ``TABLE``. Sizes follow the V2 protocol's "Tensor
Data Types" table (KServe's Open Inference Protocol, "Tensor Data Types") plus Triton's BF16. BYTES
elements are variable-length; BF16 uses ``ml_dtypes.bfloat16`` because numpy has no bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import ml_dtypes
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class DType:
    """One row of the datatype table.

    Attributes:
        v2: protocol datatype string (``"FP32"``).
        config: ``inference.DataType`` enum name in config.pbtxt (``"TYPE_FP32"``).
        numpy: numpy dtype used in memory (little-endian); ``object`` for BYTES.
        onnx: ONNX Runtime type string (``"tensor(float)"``).
        contents_field: ``InferTensorContents`` field carrying the type, or None (raw only).
        itemsize: bytes per element in raw form; 0 for BYTES (variable).
    """

    v2: str
    config: str
    numpy: np.dtype
    onnx: str
    contents_field: str | None
    itemsize: int


def _row(v2: str, dtype: npt.DTypeLike, onnx: str, field: str | None) -> DType:
    np_dtype = np.dtype(dtype)
    size = 0 if np_dtype == np.dtype(object) else np_dtype.itemsize
    config = "TYPE_STRING" if v2 == "BYTES" else f"TYPE_{v2}"
    return DType(v2, config, np_dtype, onnx, field, size)


TABLE: Final[tuple[DType, ...]] = (
    _row("BOOL", np.bool_, "tensor(bool)", "bool_contents"),
    _row("UINT8", "<u1", "tensor(uint8)", "uint_contents"),
    _row("UINT16", "<u2", "tensor(uint16)", "uint_contents"),
    _row("UINT32", "<u4", "tensor(uint32)", "uint_contents"),
    _row("UINT64", "<u8", "tensor(uint64)", "uint64_contents"),
    _row("INT8", "<i1", "tensor(int8)", "int_contents"),
    _row("INT16", "<i2", "tensor(int16)", "int_contents"),
    _row("INT32", "<i4", "tensor(int32)", "int_contents"),
    _row("INT64", "<i8", "tensor(int64)", "int64_contents"),
    _row("FP16", "<f2", "tensor(float16)", None),
    _row("FP32", "<f4", "tensor(float)", "fp32_contents"),
    _row("FP64", "<f8", "tensor(double)", "fp64_contents"),
    _row("BYTES", object, "tensor(string)", "bytes_contents"),
    _row("BF16", ml_dtypes.bfloat16, "tensor(bfloat16)", None),
)

BY_V2: Final = {d.v2: d for d in TABLE}
BY_CONFIG: Final = {d.config: d for d in TABLE}
BY_ONNX: Final = {d.onnx: d for d in TABLE}
BY_NUMPY: Final = {d.numpy: d for d in TABLE}
BYTES: Final = BY_V2["BYTES"]
BF16: Final = BY_V2["BF16"]
