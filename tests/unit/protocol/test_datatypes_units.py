"""The one datatype table (kserve_v2.protocol.datatypes): every lookup agrees with every other."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol import datatypes

# The V2 protocol's "Tensor Data Types" table plus Triton's BF16: datatype -> bytes per element.
SIZES = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
         "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BYTES": 0, "BF16": 2}


def test_table_has_every_v2_datatype_once() -> None:
    assert [d.v2 for d in datatypes.TABLE] == list(SIZES)
    for name in ("BY_V2", "BY_CONFIG", "BY_ONNX", "BY_NUMPY"):
        assert len(getattr(datatypes, name)) == len(SIZES), name


@pytest.mark.parametrize("row", datatypes.TABLE, ids=lambda d: d.v2)
def test_row_is_consistent(row: datatypes.DType) -> None:
    assert row.itemsize == SIZES[row.v2]
    assert row.config in mc.DataType.keys()
    assert datatypes.BY_CONFIG[row.config] is row
    assert datatypes.BY_ONNX[row.onnx] is row
    assert datatypes.BY_NUMPY[row.numpy] is row
    assert row.onnx.startswith("tensor(") and row.onnx.endswith(")")
    if row.itemsize:
        assert row.numpy.itemsize == row.itemsize
        assert row.numpy.byteorder in ("<", "|", "=")


def test_special_rows() -> None:
    assert datatypes.BYTES.config == "TYPE_STRING"
    assert datatypes.BYTES.numpy == np.dtype(object)
    assert datatypes.BF16.numpy == np.dtype(ml_dtypes.bfloat16)
    # FP16 and BF16 have no typed InferTensorContents field: they travel only as raw bytes
    assert datatypes.BY_V2["FP16"].contents_field is None and datatypes.BF16.contents_field is None
    # narrow integers travel widened in the 32-bit fields
    assert datatypes.BY_V2["INT8"].contents_field == "int_contents"
    assert datatypes.BY_V2["UINT16"].contents_field == "uint_contents"
