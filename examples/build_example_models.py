"""Rebuild the example model repository: Triton's example models as ONNX graphs made with onnx.helper.

Models (I/O as in Triton's ``docs/examples/model_repository``):
  simple           INT32 INPUT0/INPUT1 [16] -> OUTPUT0 = sum, OUTPUT1 = difference
  simple_int8      the same in INT8 (computed in INT32, cast back)
  simple_string    the same on decimal strings (BYTES)
  simple_identity  BYTES identity, variable length
  identity_fp32    FP32 identity, variable length (bandwidth benchmarks)
  preprocess_round FP32 RAW0/RAW1 [16] -> ROUNDED0/ROUNDED1 INT32 (round half to even, then cast)
  simple_ensemble  an ensemble (platform "ensemble"): preprocess_round, then simple, so FP32
                   INPUT0/INPUT1 [16] -> INT32 OUTPUT0 = sum, OUTPUT1 = difference of the rounded values
Sequence models (the server feeds the control inputs START/END/READY/CORRID and the state):
  simple_sequence              OUTPUT = READY * (INPUT + START); direct strategy
  simple_dyna_sequence         OUTPUT = READY * (INPUT + START + END * CORRID); oldest strategy, UINT64 CORRID
  simple_string_dyna_sequence  accumulator with implicit state: OUTPUT = sum of the sequence's INPUTs, plus
                               int(CORRID) on END; STRING CORRID (decimal ids, as Triton's dyna_sequence backend)
All have max_batch_size 8. Usage: python examples/build_example_models.py [REPOSITORY]
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

OPSET = 21
IR_VERSION = 10


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int, list]]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "main",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kserve_v2")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def add_sub(onnx_type: int, compute_type: int | None) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, optionally computed in ``compute_type``."""
    nodes, a, b = [], "INPUT0", "INPUT1"
    if compute_type is not None:
        nodes += [helper.make_node("Cast", ["INPUT0"], ["a"], to=compute_type),
                  helper.make_node("Cast", ["INPUT1"], ["b"], to=compute_type)]
        a, b = "a", "b"
    sum_name, diff_name = ("sum", "diff") if compute_type is not None else ("OUTPUT0", "OUTPUT1")
    nodes += [helper.make_node("Add", [a, b], [sum_name]), helper.make_node("Sub", [a, b], [diff_name])]
    if compute_type is not None:
        nodes += [helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=onnx_type),
                  helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=onnx_type)]
    shape = [None, 16]
    return _model(nodes, [("INPUT0", onnx_type, shape), ("INPUT1", onnx_type, shape)],
                  [("OUTPUT0", onnx_type, shape), ("OUTPUT1", onnx_type, shape)])


def identity(onnx_type: int) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 with shape [batch, -1]."""
    return _model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                  [("INPUT0", onnx_type, [None, None])], [("OUTPUT0", onnx_type, [None, None])])


def _config(name: str, config_type: str, dims: str) -> str:
    tensors = {"simple_identity": (["INPUT0"], ["OUTPUT0"]), "identity_fp32": (["INPUT0"], ["OUTPUT0"])}
    inputs, outputs = tensors.get(name, (["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]))

    def block(names: list[str]) -> str:
        return ",\n".join(f'  {{\n    name: "{n}"\n    data_type: {config_type}\n    dims: [ {dims} ]\n  }}' for n in names)

    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f"input [\n{block(inputs)}\n]\noutput [\n{block(outputs)}\n]\n")


def sequence_model(corrid: int | None, state: bool) -> onnx.ModelProto:
    """The sequence examples on INT32 [batch, 1] tensors (see the module docstring).

    ``corrid``: the CORRID input's ONNX type (None: no CORRID, START and READY only);
    ``state``: the accumulator with implicit state STATE_IN -> STATE_OUT.
    """
    one = [None, 1]
    int32 = TensorProto.INT32
    if state:
        nodes = [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
                 helper.make_node("Cast", ["CORRID"], ["corrid"], to=int32),
                 helper.make_node("Mul", ["END", "corrid"], ["on_end"]),
                 helper.make_node("Add", ["STATE_OUT", "on_end"], ["OUTPUT"])]
        inputs = [("INPUT", int32, one), ("END", int32, one), ("CORRID", TensorProto.STRING, one),
                  ("STATE_IN", int32, one)]
        return _model(nodes, inputs, [("OUTPUT", int32, one), ("STATE_OUT", int32, one)])
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["started"])]
    inputs = [("INPUT", int32, one), ("START", int32, one), ("READY", int32, one)]
    total = "started"
    if corrid is not None:
        nodes += [helper.make_node("Cast", ["CORRID"], ["corrid"], to=int32),
                  helper.make_node("Mul", ["END", "corrid"], ["on_end"]),
                  helper.make_node("Add", ["started", "on_end"], ["total"])]
        inputs += [("END", int32, one), ("CORRID", corrid, one)]
        total = "total"
    nodes.append(helper.make_node("Mul", ["READY", total], ["OUTPUT"]))
    return _model(nodes, inputs, [("OUTPUT", int32, one)])


def _flag(name: str, kind: str) -> str:
    return f'  {{\n    name: "{name}"\n    control [ {{ kind: CONTROL_SEQUENCE_{kind} int32_false_true: [ 0, 1 ] }} ]\n  }}'


def _corrid(data_type: str) -> str:
    return f'  {{\n    name: "CORRID"\n    control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {data_type} }} ]\n  }}'


_STATE = """  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }
    }
  ]
"""


def _sequence_config(name: str) -> str:
    """Triton's configurations of the sequence examples (``docs/examples/model_repository``)."""
    controls, strategy, extra, instances = [_flag("START", "START"), _flag("READY", "READY")], "", "", 1
    if name == "simple_sequence":
        strategy = "  max_sequence_idle_microseconds: 5000000\n"
    else:
        strategy = ("  max_sequence_idle_microseconds: 10000000\n"
                    "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n")
        instances = 2
    if name == "simple_dyna_sequence":
        controls += [_flag("END", "END"), _corrid("TYPE_UINT64")]
        extra = 'parameters { key: "execute_delay_ms" value { string_value: "3" } }\n'
    elif name == "simple_string_dyna_sequence":
        controls = [_flag("END", "END"), _corrid("TYPE_STRING")]
        strategy += _STATE
    body = ",\n".join(controls).replace("\n", "\n  ")
    tensor = '  {{\n    name: "{}"\n    data_type: TYPE_INT32\n    dims: [ 1 ]\n  }}'
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f"sequence_batching {{\n{strategy}  control_input [\n  {body}\n  ]\n}}\n"
            f"input [\n{tensor.format('INPUT')}\n]\noutput [\n{tensor.format('OUTPUT')}\n]\n"
            f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n{extra}")


SEQUENCE_MODELS = {
    "simple_sequence": lambda: sequence_model(None, state=False),
    "simple_dyna_sequence": lambda: sequence_model(TensorProto.UINT64, state=False),
    "simple_string_dyna_sequence": lambda: sequence_model(TensorProto.STRING, state=True),
}

MODELS = {
    "simple": (lambda: add_sub(TensorProto.INT32, None), "TYPE_INT32", "16"),
    "simple_int8": (lambda: add_sub(TensorProto.INT8, TensorProto.INT32), "TYPE_INT8", "16"),
    "simple_string": (lambda: add_sub(TensorProto.STRING, TensorProto.INT32), "TYPE_STRING", "16"),
    "simple_identity": (lambda: identity(TensorProto.STRING), "TYPE_STRING", "-1"),
    "identity_fp32": (lambda: identity(TensorProto.FLOAT), "TYPE_FP32", "-1"),
}


def preprocess_round() -> onnx.ModelProto:
    """ROUNDEDi = int32(round(RAWi)): the preprocessing step of ``simple_ensemble``."""
    nodes = []
    for i in (0, 1):
        nodes += [helper.make_node("Round", [f"RAW{i}"], [f"r{i}"]),
                  helper.make_node("Cast", [f"r{i}"], [f"ROUNDED{i}"], to=TensorProto.INT32)]
    shape = [None, 16]
    return _model(nodes, [(f"RAW{i}", TensorProto.FLOAT, shape) for i in (0, 1)],
                  [(f"ROUNDED{i}", TensorProto.INT32, shape) for i in (0, 1)])


# Triton's ensemble configuration (model_configuration.md, "Ensemble Models"); its version folder is empty
ENSEMBLE_CONFIG = """name: "simple_ensemble"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess_round"
      model_version: -1
      input_map { key: "RAW0" value: "INPUT0" }
      input_map { key: "RAW1" value: "INPUT1" }
      output_map { key: "ROUNDED0" value: "rounded0" }
      output_map { key: "ROUNDED1" value: "rounded1" }
    },
    {
      model_name: "simple"
      model_version: -1
      input_map { key: "INPUT0" value: "rounded0" }
      input_map { key: "INPUT1" value: "rounded1" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
      output_map { key: "OUTPUT1" value: "OUTPUT1" }
    }
  ]
}
"""


def build(repository: Path) -> None:
    """Write every example model (config.pbtxt and 1/model.onnx) under ``repository``."""
    for name, (make, config_type, dims) in MODELS.items():
        folder = repository / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(make(), folder / "1" / "model.onnx")
        (folder / "config.pbtxt").write_text(_config(name, config_type, dims))
    for name, make_sequence in SEQUENCE_MODELS.items():
        folder = repository / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(make_sequence(), folder / "1" / "model.onnx")
        (folder / "config.pbtxt").write_text(_sequence_config(name))
    build_ensemble(repository)


def build_ensemble(repository: Path) -> None:
    """Write ``preprocess_round`` and ``simple_ensemble`` (its version folder holds only a .gitkeep)."""
    folder = repository / "preprocess_round"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(preprocess_round(), folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text('name: "preprocess_round"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
    folder = repository / "simple_ensemble"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / ".gitkeep").write_text("")
    (folder / "config.pbtxt").write_text(ENSEMBLE_CONFIG)


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "model_repository"))
