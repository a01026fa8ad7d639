"""Triton's classification extension: an output returned as its top classes instead of its values.

A requested output whose parameters hold ``classification`` (an int64 count N; over REST a JSON
integer) comes back as BYTES of shape ``[batch, n]`` (``[n]`` for a model without batching), where
``n = min(N, elements of one batch row)``, each element ``"<value>:<index>[:<label>]"``: the n
largest values of the row (compared in the output's datatype) in descending order, the index in
the flattened row, and the label on that line of the output's ``label_filename`` when the file has
a non-empty one. Values are written as C's ``std::to_string`` writes them (``%f`` for FP32 and
FP64, decimal integers). Texts and rules from Triton's "Classification Extension" document
(``extension_classification.md``) and its server's ``classification.cc``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kserve_v2.codec.messages import InferParameter
from kserve_v2.protocol.errors import InvalidInput

PARAMETER = "classification"
# the datatypes Triton classifies: the integer types and FP32 / FP64
_CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})


def requested_count(parameter: InferParameter, datatype: str, in_shared_memory: bool) -> int:
    """The count N a requested output's ``classification`` parameter asks for.

    Raises:
        InvalidInput: (Triton's texts) a parameter that is not int64 ("invalid value type for
            'classification' parameter, expected int64_param"), a count below 1 ("invalid value
            for 'classification' parameter, expected >= 0"), an output also written to shared
            memory ("output can't set both 'shared_memory_region' and 'classification'"), or a
            datatype that has no order ("class result not available for output due to
            unsupported type '<datatype>'") -> INVALID_ARGUMENT / 400.
    """
    if parameter.choice != "int64_param":
        raise InvalidInput("invalid value type for 'classification' parameter, expected int64_param")
    count = int(parameter.value)
    if count <= 0:
        raise InvalidInput("invalid value for 'classification' parameter, expected >= 0")
    if in_shared_memory:
        raise InvalidInput("output can't set both 'shared_memory_region' and 'classification'")
    if datatype not in _CLASSIFIABLE:
        raise InvalidInput(f"class result not available for output due to unsupported type '{datatype}'")
    return count


def classify(array: np.ndarray, count: int, batching: bool, labels: Sequence[str]) -> np.ndarray:
    """The top ``count`` classes of each batch row of an output, as an object array of ``bytes``.

    Args:
        array: the output, in the shape the response would give it.
        count: N, at least 1.
        batching: whether the first dim is the batch (``max_batch_size > 0``).
        labels: the output's labels, by index (empty: none).

    Returns:
        ``[batch, n]`` (``[n]`` without a batch dim, or for a batch of 0 rows, as Triton answers).
    """
    batch = array.shape[0] if batching and array.ndim else 0
    row = math.prod(array.shape[1:]) if batch else array.size
    taken = min(count, row)
    rows = np.ascontiguousarray(array).reshape(max(batch, 1), row) if row else np.empty((max(batch, 1), 0), array.dtype)
    # descending, equal values in index order: a stable ascending sort of the reversed rows, read backwards
    order = (row - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable"))[:, ::-1][:, :taken]
    integer = array.dtype.kind in "iu"
    classes = np.empty((max(batch, 1), taken), dtype=object)
    for r, indices in enumerate(order.tolist()):
        values = rows[r, indices].tolist()
        for c, (index, value) in enumerate(zip(indices, values, strict=True)):
            text = f"{value}:{index}" if integer else f"{value:f}:{index}"
            if index < len(labels) and labels[index]:
                text = f"{text}:{labels[index]}"
            classes[r, c] = text.encode()
    return classes if batch else classes.reshape(taken)
