"""Triton's classification extension (kserve_v2.request.classification): top classes, their text, the
shapes with and without a batch dim, labels, and the parameter's checks with Triton's texts."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2.codec.messages import InferParameter
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.request.classification import classify, requested_count


def _texts(array: np.ndarray) -> list:
    return np.vectorize(bytes.decode, otypes=[object])(array).tolist()


def test_the_documents_example() -> None:
    """extension_classification.md: [1.1, 3.3, 0.5, 2.4] with count 2 -> "3.3:1", "2.4:3" (values as %f)."""
    output = np.array([1.1, 3.3, 0.5, 2.4], np.float32)
    assert _texts(classify(output, 2, False, ())) == ["3.300000:1", "2.400000:3"]
    labels = ("index_0_label", "index_1_label", "", "index_3_label")
    assert _texts(classify(output, 2, False, labels)) == ["3.300000:1:index_1_label", "2.400000:3:index_3_label"]


def test_batch_rows_are_classified_apart_and_the_count_is_capped() -> None:
    output = np.array([[[1, 9], [5, 3]], [[7, 7], [0, 8]]], np.int32)  # batch 2, rows of 4 elements
    classes = classify(output, 10, True, ("a", "b"))
    assert classes.shape == (2, 4)
    assert _texts(classes) == [["9:1:b", "5:2", "3:3", "1:0:a"], ["8:3", "7:0:a", "7:1:b", "0:2"]]  # ties: lower index first
    assert classify(output, 1, False, ()).shape == (1,)  # without batching the whole tensor is one row
    assert _texts(classify(output, 1, False, ())) == ["9:1"]


@pytest.mark.parametrize("dtype", ["uint8", "uint64", "int8", "int64", "float64"])
def test_every_classifiable_type_orders_in_its_own_type(dtype: str) -> None:
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else np.finfo(dtype)
    middle = info.max // 2 if np.dtype(dtype).kind in "iu" else 0.5
    output = np.array([[info.min, info.max, middle]], dtype)
    texts = _texts(classify(output, 3, True, ()))[0]
    assert [t.rsplit(":", 1)[1] for t in texts] == ["1", "2", "0"]
    if np.dtype(dtype).kind in "iu":
        assert texts[0] == f"{int(info.max)}:1"


def test_zero_rows_give_an_empty_tensor_as_triton_does() -> None:
    assert classify(np.zeros((0, 5), np.float32), 3, True, ()).shape == (0,)
    assert classify(np.zeros((2, 0), np.float32), 3, True, ()).shape == (2, 0)


def _parameter(**value: bool | int | float | str) -> InferParameter:
    ((choice, given),) = value.items()
    return InferParameter(choice, given)


@pytest.mark.parametrize(("parameter", "datatype", "shm", "text"), [
    (_parameter(uint64_param=3), "FP32", False, "invalid value type for 'classification' parameter, expected int64_param"),
    (_parameter(string_param="3"), "FP32", False, "invalid value type for 'classification' parameter, expected int64_param"),
    (_parameter(int64_param=0), "FP32", False, "invalid value for 'classification' parameter, expected >= 0"),
    (_parameter(int64_param=-2), "FP32", False, "invalid value for 'classification' parameter, expected >= 0"),
    (_parameter(int64_param=2), "FP32", True, "output can't set both 'shared_memory_region' and 'classification'"),
    (_parameter(int64_param=2), "BYTES", False, "class result not available for output due to unsupported type 'BYTES'"),
    (_parameter(int64_param=2), "FP16", False, "class result not available for output due to unsupported type 'FP16'"),
    (_parameter(int64_param=2), "BOOL", False, "class result not available for output due to unsupported type 'BOOL'"),
])
def test_bad_parameters_get_tritons_texts(parameter: InferParameter, datatype: str, shm: bool, text: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        requested_count(parameter, datatype, shm)
    assert str(raised.value) == text


def test_a_good_parameter_gives_its_count() -> None:
    assert requested_count(_parameter(int64_param=5), "INT16", False) == 5
