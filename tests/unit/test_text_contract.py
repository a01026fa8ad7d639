"""The text contract (kserve_v2.text) and the V2 interface a text adapter derives from it (no server)."""

from __future__ import annotations

from adapters.base import v2_interface
from adapters.embedding import DENSE_OUTPUTS
from kserve_v2.text import NOT_TEXT, InputKind, OutputKind, TextContract, TextInput, TextOutput

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
