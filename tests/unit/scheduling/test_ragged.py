"""Ragged batching's pure parts (kserve_v2.scheduling.ragged): the batch input kinds with the values of Triton's
qa/L0_batch_input, merging ragged rows, scattering batch outputs, the batch key and the load checks."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.errors import InternalError
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.scheduling.ragged import (RaggedBatching, RaggedModel, batch_input_names, batch_input_tensor, config_problem,
                                         merge_ragged, split_ragged)

SHAPES = [(1, 2), (1, 4), (1, 1), (1, 3)]  # the requests of Triton's batch_input_test.py


def _batch_input(kind: str, data_type: str = "TYPE_FP32") -> mc.BatchInput:
    return text_format.Parse(f'kind: {kind} target_name: "B" data_type: {data_type} source_input: "R"', mc.BatchInput())


@pytest.mark.parametrize(("kind", "expected"), [
    ("BATCH_ELEMENT_COUNT", [2, 4, 1, 3]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", [2, 6, 7, 10]),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 2, 6, 7, 10]),
])
def test_element_counts(kind: str, expected: list[int]) -> None:
    tensor = batch_input_tensor(_batch_input(kind), SHAPES)
    assert tensor.dtype == np.float32 and tensor.tolist() == expected
    assert batch_input_tensor(_batch_input(kind, "TYPE_INT32"), SHAPES).dtype == np.int32


def test_max_element_count_is_a_shape() -> None:
    assert batch_input_tensor(_batch_input("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"), SHAPES).shape == (4,)


def test_item_shapes() -> None:
    # Triton's test_batch_item_shape_flatten and test_batch_item_shape
    flat = batch_input_tensor(_batch_input("BATCH_ITEM_SHAPE_FLATTEN"), [(1, 4, 1), (1, 1, 2), (1, 1, 2), (1, 2, 2)])
    assert flat.tolist() == [4, 1, 1, 2, 1, 2, 2, 2]
    items = batch_input_tensor(_batch_input("BATCH_ITEM_SHAPE"), [(2, 1, 2), (1, 1, 2), (1, 2, 2)])
    assert items.tolist() == [[1, 2], [1, 2], [1, 2], [2, 2]]


CONFIG = text_format.Parse("""name: "m" max_batch_size: 8
input [{ name: "R" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true }, { name: "X" data_type: TYPE_FP32 dims: [2] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }, { name: "ROWS" data_type: TYPE_FP32 dims: [2] }]
batch_input [{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "I" target_name: "J" data_type: TYPE_INT32
               source_input: "R" }]
batch_output [{ target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "R" }]""", mc.ModelConfig())


def _member(length: int, rows: int = 1) -> dict[str, np.ndarray]:
    return {"R": np.full((rows, length), length, np.float32), "X": np.full((rows, 2), length, np.float32)}


def test_merge_flattens_ragged_inputs_and_adds_batch_inputs() -> None:
    merged = merge_ragged(CONFIG, [_member(2), _member(3, rows=2)])
    assert merged["R"].tolist() == [2, 2] + [3] * 6
    assert merged["X"].shape == (3, 2)
    assert merged["I"].tolist() == merged["J"].tolist() == [2, 8]
    assert batch_input_names(CONFIG) == {"I", "J"}


def test_split_scatters_batch_outputs_and_splits_the_others() -> None:
    members = [_member(2), _member(3, rows=2)]
    merged = merge_ragged(CONFIG, members)
    execution = Execution([merged["R"] * 2, merged["X"]])
    first, second = split_ragged(CONFIG, execution, ["OUT", "ROWS"], members)
    assert first.outputs[0].tolist() == [[4, 4]] and second.outputs[0].tolist() == [[6, 6, 6], [6, 6, 6]]
    assert first.outputs[1].shape == (1, 2) and second.outputs[1].shape == (2, 2)
    assert (first.executions, second.executions) == (1, 0)
    with pytest.raises(InternalError, match="batch output 'OUT' has 3 elements"):
        split_ragged(CONFIG, Execution([merged["R"][:3], merged["X"]]), ["OUT", "ROWS"], members)


class _Doubler:
    """A tensor model: OUT = R * 2, ROWS = X; records the feeds it ran on."""

    inputs = (TensorDeclaration("R", datatypes.BY_CONFIG["TYPE_FP32"], (-1,)),)
    outputs = ()
    on_cuda = batchable = threaded = False
    batching = text = None

    def __init__(self) -> None:
        self.fed: list[dict[str, np.ndarray]] = []

    def execute(self, feeds, output_names, parameters, context=None) -> Execution:  # type: ignore[no-untyped-def]
        self.fed.append(feeds)
        return Execution([feeds["R"] * 2, feeds["X"]])

    def close(self) -> None:
        pass


def test_a_request_alone_runs_as_a_batch_of_one_and_keys_ignore_ragged_shapes() -> None:
    backend = _Doubler()
    model = RaggedModel(CONFIG, backend)  # type: ignore[arg-type]
    result = model.execute(_member(3), ["OUT", "ROWS"], {})
    assert result.outputs[0].tolist() == [[6, 6, 6]] and backend.fed[0]["I"].tolist() == [3]
    strategy = model.batching
    assert isinstance(strategy, RaggedBatching)
    assert strategy.key(_member(2), ["OUT"], {}) == strategy.key(_member(5), ["OUT"], {})
    other = {"R": np.ones((1, 2), np.float32), "X": np.ones((1, 3), np.float32)}
    assert strategy.key(_member(2), ["OUT"], {}) != strategy.key(other, ["OUT"], {})
    shares = strategy.execute_batch([_member(1), _member(4)], ["OUT", "ROWS"], {})
    assert [s.outputs[0].shape for s in shares if isinstance(s, Execution)] == [(1, 1), (1, 4)]


@pytest.mark.parametrize(("edit", "problem"), [
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "I" data_type: TYPE_FP64 source_input: "R" }]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "I" data_type: TYPE_FP32 source_input: "Q" }]',
     "unknown source input name 'Q'"),
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "I" data_type: TYPE_FP32 }]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0"),
    ('batch_output [{ target_name: "NOPE" source_input: "R" }]', "unknown target output name 'NOPE'"),
    ('batch_output [{ target_name: "OUT" target_name: "OUT" source_input: "R" }]',
     "target output name 'OUT' can only be specified once"),
])
def test_triton_load_checks(edit: str, problem: str) -> None:
    config = text_format.Parse('name: "m" max_batch_size: 4 input [{ name: "R" data_type: TYPE_FP32 dims: [-1] '
                               'allow_ragged_batch: true }] output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]',
                               mc.ModelConfig())
    text_format.Merge(edit, config)
    found = config_problem(config, ())
    assert found is not None and problem in found


def test_without_batching_a_request_is_flattened_and_scattered_back() -> None:
    config = mc.ModelConfig()
    config.CopyFrom(CONFIG)
    config.max_batch_size = 0
    member = {"R": np.ones((2, 3), np.float32), "X": np.ones((1, 2), np.float32)}
    merged = merge_ragged(config, [member])
    assert merged["R"].shape == (6,) and merged["I"].tolist() == [6]
    (share,) = split_ragged(config, Execution([merged["R"], merged["X"]]), ["OUT", "ROWS"], [member])
    assert share.outputs[0].shape == (2,)  # dims [-1]: the source input's first dim


def test_a_ragged_input_must_be_one_dim_in_the_model() -> None:
    graph = [TensorDeclaration("R", datatypes.BY_CONFIG["TYPE_FP32"], (-1, -1)),
             TensorDeclaration("X", datatypes.BY_CONFIG["TYPE_FP32"], (-1, 2)),
             TensorDeclaration("I", datatypes.BY_CONFIG["TYPE_INT32"], (-1,)),
             TensorDeclaration("J", datatypes.BY_CONFIG["TYPE_INT32"], (-1,))]
    assert "expects model provides input with shape [-1]  for ragged input 'R', model provides [-1,-1]" in (
        config_problem(CONFIG, graph) or "")
    graph[0] = TensorDeclaration("R", datatypes.BY_CONFIG["TYPE_FP32"], (-1,))
    assert config_problem(CONFIG, graph) is None
    graph[3] = TensorDeclaration("J", datatypes.BY_CONFIG["TYPE_FP32"], (-1,))
    assert "expects datatype TYPE_INT32 for batch input 'J', model provides TYPE_FP32" in (config_problem(CONFIG, graph) or "")
