"""config.pbtxt parsing, auto-complete and validation (kserve_v2.repository.config), Triton's rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.protocol.model_spec import TensorDeclaration as OnnxTensor
from kserve_v2.repository import config as cfg
from kserve_v2.repository.config import ConfigError
from kserve_v2.scheduling.sequence_config import SequenceConfigError, SequenceSettings

FP32, INT64 = BY_V2["FP32"], BY_V2["INT64"]
DYNAMIC_IN = [OnnxTensor("INPUT0", FP32, (-1, 16))]
DYNAMIC_OUT = [OnnxTensor("OUTPUT0", FP32, (-1, 16))]


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / cfg.CONFIG_FILE).write_text(text)
    return folder


def test_missing_config_defaults_to_onnxruntime(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    config = cfg.read_config(tmp_path / "m", "m")
    assert (config.name, config.platform, config.backend) == ("m", cfg.PLATFORM, "onnxruntime")


def test_name_must_match_the_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not match the folder name 'm'"):
        cfg.read_config(write(tmp_path / "m", 'name: "other"'), "m")


def test_unparsable_and_unsupported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="failed to parse"):
        cfg.read_config(write(tmp_path / "a", "max_batch_size: {"), "a")
    with pytest.raises(ConfigError, match="failed to parse"):
        cfg.read_config(tmp_path / "a", "a", override_json="{not json")
    with pytest.raises(ConfigError, match="unsupported platform 'tensorrt_plan'"):
        cfg.read_config(write(tmp_path / "b", 'platform: "tensorrt_plan"'), "b")
    with pytest.raises(ConfigError, match="max_batch_size must be >= 0"):
        cfg.read_config(write(tmp_path / "c", "max_batch_size: -1"), "c")


def test_json_override_replaces_the_file(tmp_path: Path) -> None:
    folder = write(tmp_path / "m", "max_batch_size: 2")
    assert cfg.read_config(folder, "m", override_json='{"max_batch_size": 7}').max_batch_size == 7


@pytest.mark.parametrize("text", [
    'default_model_filename: "/etc/passwd"',
    'default_model_filename: "../other/model.onnx"',
    'default_model_filename: "a\\\\b"',
    'output { name: "o" label_filename: "x/ .. /labels.txt" }',
    'model_operations { op_library_filename: "../../lib.so" }',
])
def test_config_paths_are_confined(text: str) -> None:
    with pytest.raises(ConfigError, match="must be a relative path inside the model folder") as caught:
        cfg.check_config_paths(parse(text), "m")
    assert "passwd" not in str(caught.value) and "lib.so" not in str(caught.value)


def test_config_paths_lists_every_named_file() -> None:
    config = parse('default_model_filename: "a.onnx" cc_model_filenames { key: "7.5" value: "b.onnx" } '
                   'output { name: "o" label_filename: "l.txt" }')
    assert sorted(cfg.config_paths(config)) == [("cc_model_filenames", "b.onnx"),
                                               ("default_model_filename", "a.onnx"),
                                               ("label_filename", "l.txt")]


def test_auto_complete_turns_batching_on_for_dynamic_graphs() -> None:
    config = parse('name: "m"')
    cfg.complete_tensors(config, DYNAMIC_IN, DYNAMIC_OUT)
    assert config.max_batch_size == cfg.DEFAULT_MAX_BATCH_SIZE
    assert config.HasField("dynamic_batching")
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [("INPUT0", "TYPE_FP32", [16])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("OUTPUT0", [16])]
    cfg.validate(config, DYNAMIC_IN, DYNAMIC_OUT)


def test_auto_complete_keeps_batching_off_for_fixed_first_dims() -> None:
    config = parse('name: "m"')
    fixed = [OnnxTensor("INPUT0", INT64, (3, 4))]
    cfg.complete_tensors(config, fixed, [OnnxTensor("OUTPUT0", INT64, (3, 4))])
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [3, 4]


def test_auto_complete_fills_declared_tensors_only_where_empty() -> None:
    config = parse('name: "m" max_batch_size: 8 input { name: "INPUT0" dims: [-1] } output { name: "OUTPUT0" }')
    cfg.complete_tensors(config, DYNAMIC_IN, DYNAMIC_OUT)
    assert list(config.input[0].dims) == [-1] and config.input[0].data_type == mc.TYPE_FP32
    assert list(config.output[0].dims) == [16]
    with pytest.raises(ConfigError) as err:
        cfg.validate(parse('name: "m" max_batch_size: 8 input { name: "INPUT0" data_type: TYPE_FP32 dims: [8] }'),
                     DYNAMIC_IN, DYNAMIC_OUT)
    assert str(err.value) == ("model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model "
                              "configuration specifies 2 dimensions (an initial batch dimension because max_batch_size "
                              "> 0 followed by the explicit tensor shape, making complete shape [-1,8])")


TWO_IN = [OnnxTensor("INPUT0", BY_V2["INT32"], (-1, 16)), OnnxTensor("INPUT1", BY_V2["INT32"], (-1, 16))]
TWO_OUT = [OnnxTensor("OUTPUT0", BY_V2["INT8"], (-1, 16)), OnnxTensor("OUTPUT1", BY_V2["INT8"], (-1, 16))]
IN16 = 'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [16] }]'
OUT16 = ('output [{ name: "OUTPUT0" data_type: TYPE_INT8 dims: [16] }, '
         '{ name: "OUTPUT1" data_type: TYPE_INT8 dims: [16] }]')


@pytest.mark.parametrize(("text", "message"), [
    # Triton's qa/L0_model_config autofill_noplatform/onnx cases, with their expected texts
    ('max_batch_size: 1 input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16, 1] }, '
     f'{{ name: "INPUT1" data_type: TYPE_INT32 dims: [16] }}] {OUT16}',
     "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration specifies "
     "3 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
     "complete shape [-1,16,1])"),
    (f'max_batch_size: 1 {IN16} output [{{ name: "OUTPUT0" data_type: TYPE_INT8 dims: [16] }}, '
     '{ name: "OUTPUT1" data_type: TYPE_INT8 dims: [1] }]',
     "model 'm', tensor 'OUTPUT1': the model expects 2 dimensions (shape [-1,16]) but the model configuration specifies "
     "2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making "
     "complete shape [-1,1])"),
    (f'max_batch_size: 1 input [{{ name: "INPUT1" data_type: TYPE_INT32 dims: [16] }}] {OUT16}',
     "unable to load model 'm', configuration expects 1 inputs, model provides 2"),
    (f'max_batch_size: 1 {IN16[:-1]}, {{ name: "INPUT_EXTRA" data_type: TYPE_INT32 dims: [16] }}] {OUT16}',
     "unable to load model 'm', configuration expects 3 inputs, model provides 2"),
    ('max_batch_size: 1 input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }, '
     f'{{ name: "INPUT_UNKNOWN" data_type: TYPE_INT32 dims: [16] }}] {OUT16}',
     "unexpected inference input 'INPUT_UNKNOWN', allowed inputs are: INPUT0, INPUT1"),
    (f'max_batch_size: 1 {IN16} output [{{ name: "OUTPUT_UNKNOWN" data_type: TYPE_INT8 dims: [16] }}]',
     "unexpected inference output 'OUTPUT_UNKNOWN', allowed outputs are: OUTPUT0, OUTPUT1"),
    # the other checks of Triton's onnxruntime backend
    (f'max_batch_size: 1 {IN16.replace("TYPE_INT32", "TYPE_FP32", 1)} {OUT16}',
     "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'INPUT0', model provides TYPE_INT32"),
    (f'max_batch_size: 1 {IN16} {OUT16.replace("TYPE_INT8", "TYPE_STRING", 1)}',
     "unable to load model 'm', configuration expects datatype TYPE_STRING for output 'OUTPUT0', model provides "
     "TYPE_INT8"),
    (f'max_batch_size: 0 {IN16} {OUT16}',
     "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration specifies "
     "1 dimensions (shape [16])"),
    (f'max_batch_size: 4 dynamic_batching {{ preferred_batch_size: [8] }} {IN16} {OUT16}',
     "dynamic batching preferred size must be <= max batch size for m: [8]"),
])
def test_validate_refuses_with_tritons_texts(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        cfg.validate(parse('name: "m" ' + text), TWO_IN, TWO_OUT)
    assert str(err.value) == message


@pytest.mark.parametrize(("model_dims", "config_dims"), [((-1, -1), "[16]"), ((-1, 16), "[-1]")])
def test_a_variable_dim_on_either_side_matches(model_dims: tuple[int, ...], config_dims: str) -> None:
    """Triton's ``compare_exact = false`` lets the model's -1 take any configured dim; this server also lets a
    configured -1 take a fixed model dim (Triton refuses that, and for outputs a fixed dim for a model's -1)."""
    tensors = [OnnxTensor("INPUT0", FP32, model_dims)], [OnnxTensor("OUTPUT0", FP32, model_dims)]
    cfg.validate(parse(f'name: "m" max_batch_size: 2 input {{ name: "INPUT0" data_type: TYPE_FP32 dims: {config_dims} }} '
                       f'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {config_dims} }}'), *tensors)


def test_batching_needs_a_dynamic_first_dim() -> None:
    fixed = [OnnxTensor("INPUT0", FP32, (2, 16))]
    with pytest.raises(ConfigError) as err:
        cfg.validate(parse('name: "m" max_batch_size: 4 input { name: "INPUT0" data_type: TYPE_FP32 dims: [16] }'),
                     fixed, [])
    assert str(err.value) == ("model 'm', tensor 'INPUT0': for the model to support batching the shape should have at "
                              "least 1 dimension and the first dimension must be -1; but shape expected by the model is "
                              "[2,16]")


@pytest.mark.parametrize(("dims", "loads"), [("[1]", True), ("[]", True), ("[1, 1]", True), ("[2]", False)])
def test_a_scalar_tensor_takes_only_dims_of_1(dims: str, loads: bool) -> None:
    """Triton's qa/L0_scalar_io: a rank-0 ONNX tensor whose config gives dims [2] fails to load."""
    scalar_in, scalar_out = [OnnxTensor("INPUT", FP32, ())], [OnnxTensor("OUTPUT", FP32, ())]
    config = parse(f'name: "m" input {{ name: "INPUT" data_type: TYPE_FP32 dims: {dims} }} '
                   f'output {{ name: "OUTPUT" data_type: TYPE_FP32 dims: {dims} }}')
    if loads:
        cfg.validate(config, scalar_in, scalar_out)
        return
    with pytest.raises(ConfigError) as err:
        cfg.validate(config, scalar_in, scalar_out)
    assert str(err.value) == ("unable to load model 'm', scalar tensor 'INPUT', should only provide 1 in the model "
                              "configuration when the model doesn't support batching. Model configuration provided: "
                              "[2].")


@pytest.mark.parametrize(("start", "message"), [
    (None, "configuration specified sequence control 'START', but model does not provide that input"),
    (OnnxTensor("START", BY_V2["INT32"], (-1, 2)),
     "unable to load model 'm', sequence control 'START' in model has dims [2] but dims [1] is expected"),
    (OnnxTensor("START", BY_V2["INT32"], ()),
     "unable to load model 'm', sequence control 'START' in model has dims [] but dims [1] is expected"),
    (OnnxTensor("START", FP32, (-1, 1)),
     "unable to load model 'm', sequence control 'START', the model expects data-type FLOAT but the model "
     "configuration specifies data-type TYPE_INT32"),
])
def test_sequence_controls_are_checked_with_tritons_texts(tmp_path: Path, start: OnnxTensor | None,
                                                          message: str) -> None:
    config = parse('name: "m" max_batch_size: 2 sequence_batching { control_input [{ name: "START" '
                   'control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }] }')
    inputs = DYNAMIC_IN + ([start] if start is not None else [])
    with pytest.raises(SequenceConfigError) as err:
        SequenceSettings.from_config(config, tmp_path, inputs, DYNAMIC_OUT)
    assert str(err.value) == message


def test_instances_default_to_two_on_cpu_for_onnxruntime_else_one_and_one_per_gpu() -> None:
    config = parse('name: "m" backend: "onnxruntime"')
    cfg.complete_instances(config, gpus=0)
    assert config.version_policy.latest.num_versions == 1
    group = config.instance_group[0]
    assert (group.kind, group.count, group.name) == (mc.ModelInstanceGroup.KIND_CPU, 2, "m_0")
    for backend in ("python", "text_embedding"):  # Triton: only TensorFlow and ONNX Runtime opt into two
        other = parse(f'name: "m" backend: "{backend}" instance_group [{{ kind: KIND_CPU }}]')
        cfg.complete_instances(other, gpus=0)
        assert other.instance_group[0].count == 1
    gpu = parse('name: "m"')
    cfg.complete_instances(gpu, gpus=2)
    assert (gpu.instance_group[0].kind, list(gpu.instance_group[0].gpus), gpu.instance_group[0].count) == (
        mc.ModelInstanceGroup.KIND_GPU, [0, 1], 1)


def test_instances_refuse_missing_gpus_and_kind_model() -> None:
    with pytest.raises(ConfigError, match=r"asks for GPUs \[3\] but 1 are usable"):
        cfg.complete_instances(parse('name: "m" instance_group { kind: KIND_GPU gpus: [3] }'), gpus=1)
    with pytest.raises(ConfigError, match="KIND_MODEL is not supported"):
        cfg.complete_instances(parse('name: "m" instance_group { kind: KIND_MODEL }'), gpus=0)
