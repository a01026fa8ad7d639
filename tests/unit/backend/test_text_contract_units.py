"""The text contract (kserve_v2.backend.text) and the V2 interface a text adapter derives from it (no server)."""

from __future__ import annotations

import numpy as np

from adapters.base import v2_interface
from adapters.batching import split_outputs
from adapters.embedding import DENSE_OUTPUTS
from kserve_v2.backend.text import NOT_TEXT, InputKind, OutputKind, TextContract, TextInput, TextOutput

EMBEDDING = TextContract(
    (TextInput(InputKind.TEXT), TextInput(InputKind.QUERY, optional=True)),
    (*(TextOutput(OutputKind.DENSE, dtype, 384, name) for dtype, name in DENSE_OUTPUTS.items()),
     TextOutput(OutputKind.MULTIVECTOR, "float32", 384, "multivector", lengths="multivector_lengths"),
     TextOutput(OutputKind.SCORE, "float32", 0, "scores")), 256)
SPARSE = TextContract((TextInput(InputKind.TEXT),),
                      (TextOutput(OutputKind.SCORE, "float32", 0, "scores"),
                       TextOutput(OutputKind.SPARSE, "float32", 30522, "sparse_values", lengths="sparse_lengths",
                                  indices="sparse_indices")), 512)


def test_kinds_outputs_and_widths() -> None:
    assert EMBEDDING.kinds() == [OutputKind.DENSE, OutputKind.MULTIVECTOR, OutputKind.SCORE]
    assert SPARSE.kinds() == [OutputKind.SPARSE, OutputKind.SCORE]  # OutputKind order, not declaration order
    assert EMBEDDING.output(OutputKind.DENSE).values == "dense"  # the first of a kind is its default
    assert EMBEDDING.output(OutputKind.DENSE, "binary").values == "dense_binary"
    assert EMBEDDING.output(OutputKind.SPARSE) is None and EMBEDDING.output(OutputKind.DENSE, "float64") is None
    assert (EMBEDDING.width(OutputKind.DENSE), SPARSE.width(OutputKind.SPARSE), SPARSE.width(OutputKind.DENSE)) == (
        384, 30522, 0)
    assert SPARSE.output(OutputKind.SPARSE).tensors == ("sparse_indices", "sparse_values", "sparse_lengths")
    assert EMBEDDING.takes(InputKind.QUERY) and not SPARSE.takes(InputKind.QUERY)
    assert NOT_TEXT.kinds() == [] and not NOT_TEXT.takes(InputKind.TEXT)


def test_the_v2_interface_follows_the_contract() -> None:
    inputs, outputs = v2_interface(EMBEDDING)
    assert [(t.name, t.dtype.v2, t.shape, t.optional) for t in inputs] == [("text", "BYTES", (-1,), False),
                                                                           ("query", "BYTES", (1,), True)]
    assert [(t.name, t.dtype.v2, t.shape) for t in outputs] == [
        ("dense", "FP32", (-1, 384)), ("dense_fp16", "FP16", (-1, 384)), ("dense_int8", "INT8", (-1, 384)),
        ("dense_binary", "UINT8", (-1, 48)), ("multivector", "FP32", (-1, 384)), ("multivector_lengths", "INT64", (-1,)),
        ("scores", "FP32", (-1,))]
    _, outputs = v2_interface(SPARSE)
    assert [(t.name, t.dtype.v2, t.shape) for t in outputs] == [
        ("scores", "FP32", (-1,)), ("sparse_indices", "INT64", (-1,)), ("sparse_values", "FP32", (-1,)),
        ("sparse_lengths", "INT64", (-1,))]


def test_text_batching_splits_each_output_back_per_request() -> None:
    computed = {"dense": np.arange(6, dtype=np.float32).reshape(3, 2),  # 3 texts: 2 from the first request, 1
                "multivector": np.arange(10, dtype=np.float32).reshape(5, 2),
                "multivector_lengths": np.array([1, 3, 1]), "scores": np.zeros(0, dtype=np.float32)}
    first, second = split_outputs(computed, ["dense", "multivector", "multivector_lengths", "scores"], [2, 1],
                           {"multivector": "multivector_lengths"})
    assert first[0].tolist() == [[0, 1], [2, 3]] and second[0].tolist() == [[4, 5]]
    assert first[1].shape == (4, 2) and second[1].tolist() == [[8, 9]]  # ragged rows by the lengths
    assert first[2].tolist() == [1, 3] and second[2].tolist() == [1]
    assert len(first[3]) == len(second[3]) == 0  # scores without a query: empty for everyone
