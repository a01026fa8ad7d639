"""config.pbtxt: parse, auto-complete from the ONNX graph, and validate.

Follows Triton (``model_configuration.md``, onnxruntime backend): ``config.pbtxt`` (or
``configs/<name>.pbtxt`` with ``--model-config-name``) is optional unless auto-complete is disabled;
``name`` defaults to the folder name; a configuration naming no backend takes the one its version
folder's model file names (``model.onnx``, ``model.py``: ``complete_backend``, Triton's core);
missing inputs and outputs come from the ONNX graph;
``max_batch_size`` becomes the backend's ``default-max-batch-size`` (``--backend-config``, Triton's
default 4) when the config declares no tensors and every graph tensor has a dynamic first dim;
``instance_group`` defaults to one instance per GPU, or two CPU instances.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from google.protobuf import json_format, text_format

from kserve_v2 import backend
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.repository import layout
from kserve_v2.scheduling.dynamic_batcher import queue_policy_problem
from kserve_v2.scheduling.ragged import batch_input_names, config_problem as ragged_problem
from kserve_v2.scheduling.sequence_config import reserved_names
from kserve_v2.settings.backend_config import DEFAULT_MAX_BATCH_SIZE

if TYPE_CHECKING:
    from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

_Tensor = TypeVar("_Tensor", mc.ModelInput, mc.ModelOutput)

CONFIG_FILE = "config.pbtxt"
CONFIGS_FOLDER = "configs"  # Triton's --model-config-name: configs/<name>.pbtxt
PLATFORM = "onnxruntime_onnx"
ENSEMBLE = "ensemble"  # Triton's ensemble platform: steps run other models (kserve_v2.scheduling.ensemble)
DEFAULT_CPU_INSTANCES = 2
# the backends that opt into DEFAULT_CPU_INSTANCES; every other backend's groups default to one instance
# (Triton core's SetDefaultInstanceCount: "pytorch, OpenVINO ... have high overhead with multiple instances")
DEFAULT_CPU_INSTANCES_BACKENDS = frozenset({backend.ONNXRUNTIME, "tensorflow"})


class ConfigError(Exception):
    """A configuration that cannot be served; the message becomes the load failure reason."""


def config_paths(config: mc.ModelConfig) -> list[tuple[str, str]]:
    """Every file path a configuration names, as (field, path): the model file names, output
    label files, warmup data files and operation libraries (``model_configuration.md``)."""
    paths = [("default_model_filename", config.default_model_filename)]
    paths += [("cc_model_filenames", name) for name in config.cc_model_filenames.values()]
    paths += [("label_filename", output.label_filename) for output in config.output]
    paths += [("input_data_file", data.input_data_file) for warmup in config.model_warmup
              for data in warmup.inputs.values()]
    paths += [("op_library_filename", name) for name in config.model_operations.op_library_filename]
    return [(where, path) for where, path in paths if path]


def check_config_paths(config: mc.ModelConfig, name: str) -> None:
    """Refuse a configuration naming a path that could leave the model's folder, before any file is touched.

    Raises:
        ConfigError: an absolute path, a ``..`` component, a backslash or NUL ("model '<m>': <field>
            must be a relative path inside the model folder"); the message never echoes the path.
    """
    for where, path in config_paths(config):
        parts = path.split("/")
        if path.startswith("/") or "\\" in path or "\0" in path or any(p.strip() == ".." for p in parts):
            raise ConfigError(f"model '{name}': {where} must be a relative path inside the model folder")


def config_file(model_dir: Path, config_name: str = "") -> Path:
    """The configuration file of a model folder: ``configs/<config_name>.pbtxt`` when ``config_name``
    is given (Triton's ``--model-config-name``) and that file exists, else ``config.pbtxt`` (Triton
    core's ``GetModelConfigFullPath``)."""
    if config_name:
        custom = model_dir / CONFIGS_FOLDER / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILE


def read_config(model_dir: Path, name: str, override_json: str | None = None, config_name: str = "",
                auto_complete: bool = True) -> mc.ModelConfig:
    """Read the configuration file (``config_file``), or a JSON override (protobuf JSON as Triton's
    load API takes). Without ``auto_complete`` (Triton's ``--disable-auto-complete-config``) the file
    must exist.

    Raises:
        ConfigError: unparsable text or JSON, a ``name`` that differs from the folder, or no file
            without ``auto_complete``.
    """
    config = mc.ModelConfig()
    path = config_file(model_dir, config_name)
    if override_json is None and not auto_complete and not path.is_file():
        raise ConfigError(f"model '{name}': the model configuration file "
                          f"'{path.relative_to(model_dir)}' must exist: auto-complete is disabled")
    try:
        if override_json is not None:
            json_format.Parse(override_json, config)
        elif path.is_file():
            text_format.Parse(path.read_text(encoding="utf-8"), config)
    except (text_format.ParseError, json_format.ParseError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"failed to parse model configuration: {err}") from None
    if config.name and config.name != name:
        raise ConfigError(f"model name '{config.name}' in the configuration does not match the folder name '{name}'")
    config.name = name
    check_config_paths(config, name)
    complete_backend(config, model_dir)
    if config.platform in ("", PLATFORM) and config.backend in ("", backend.ONNXRUNTIME):
        config.platform, config.backend = PLATFORM, backend.ONNXRUNTIME
    elif (config.platform and config.platform != ENSEMBLE) or (config.backend and backend.find(config.backend) is None):
        raise ConfigError(
            f"unsupported platform '{config.platform}' / backend '{config.backend}': this server runs "
            f"platforms '{PLATFORM}' and '{ENSEMBLE}' and the backends {backend.names()}"
        )
    if config.max_batch_size < 0:
        raise ConfigError("max_batch_size must be >= 0")
    if (problem := queue_policy_problem(config)) is not None:
        raise ConfigError(problem)
    return config


# Triton's core (constants.h): the model file that tells each backend apart, and the platforms it implies
_TF_SAVEDMODEL, _TF_GRAPHDEF, _TF_PLATFORMS = "model.savedmodel", "model.graphdef", {
    "model.savedmodel": "tensorflow_savedmodel", "model.graphdef": "tensorflow_graphdef"}
_TENSORRT_FILE, _TENSORRT_PLATFORM = "model.plan", "tensorrt_plan"
_ONNX_FILE, _OPENVINO_FILE, _PYTHON_FILE = "model.onnx", "model.xml", "model.py"
_LIBTORCH_FILE, _LIBTORCH_PLATFORMS, _AOTI_FILE, _AOTI_PLATFORM = "model.pt", ("pytorch_libtorch", "libtorch"), \
    "model.pt2", "torch_aoti"


def complete_backend(config: mc.ModelConfig, model_dir: Path) -> None:
    """Fill ``backend`` and ``platform`` (in place) the way Triton's core does before any backend runs
    (``AutoCompleteBackendFields`` in ``model_config_utils.cc``, triton-inference-server/core).

    Each backend in Triton's order (TensorFlow, TensorRT, ONNX Runtime, OpenVINO, PyTorch, python)
    is recognised by its platform, then its ``default_model_filename``, then, when the configuration
    names neither a platform nor a file, by its model file (``model.onnx``, ``model.py``, ...) in the
    lowest version folder. When nothing names a backend, a model named ``<name>.<backend>`` takes that
    backend (Triton's custom backends). Backends this server does not run are named too, so that the
    load is refused naming them. Unlike Triton, which looks into the first subfolder by name (version
    folder or not), only version folders count; the backend's file name is not written into
    ``default_model_filename``; and a configuration that still names no backend (no version folder,
    or a file name no backend claims) is left to the onnxruntime default.

    Raises:
        ConfigError: a version folder that holds no model file any backend claims, no backend or
            platform configured and a name without a dot (Triton's "Invalid model name: Could not
            determine backend for model '<m>' ...").
    """
    try:
        versions = layout.version_dirs(model_dir)
    except OSError:
        versions = []
    folder = model_dir / str(versions[0]) if versions else None
    files = set(_listing(folder)) if folder is not None else set()

    def found(file: str, is_dir: bool | None = None) -> bool:
        """The first version folder holds ``file`` (of that kind), and the configuration names no platform or file."""
        if config.platform or config.default_model_filename or folder is None or file not in files:
            return False
        return is_dir is None or (folder / file).is_dir() == is_dir

    filename = config.default_model_filename
    if not config.platform and config.backend in ("", "tensorflow"):
        if filename in _TF_PLATFORMS:
            config.platform = _TF_PLATFORMS[filename]
        elif found(_TF_SAVEDMODEL, is_dir=True):
            config.platform = _TF_PLATFORMS[_TF_SAVEDMODEL]
        elif found(_TF_GRAPHDEF, is_dir=False):
            config.platform = _TF_PLATFORMS[_TF_GRAPHDEF]
    if config.platform in _TF_PLATFORMS.values():
        config.backend = config.backend or "tensorflow"
        return
    if not config.backend:
        if config.platform == _TENSORRT_PLATFORM or filename == _TENSORRT_FILE or found(_TENSORRT_FILE, is_dir=False):
            config.backend = "tensorrt"
        elif config.platform == PLATFORM or filename == _ONNX_FILE or found(_ONNX_FILE):
            config.backend = backend.ONNXRUNTIME
        elif filename == _OPENVINO_FILE or found(_OPENVINO_FILE):
            config.backend = "openvino"
        elif config.platform in _LIBTORCH_PLATFORMS or filename == _LIBTORCH_FILE:
            config.backend = "pytorch"
        elif config.platform == _AOTI_PLATFORM or filename == _AOTI_FILE:
            config.backend = "pytorch"
        elif found(_LIBTORCH_FILE, is_dir=False):
            config.backend, config.platform = "pytorch", _LIBTORCH_PLATFORMS[0]
        elif _LIBTORCH_FILE not in files and found(_AOTI_FILE, is_dir=False):
            config.backend, config.platform = "pytorch", _AOTI_PLATFORM
        elif filename == _PYTHON_FILE or found(_PYTHON_FILE):
            config.backend = backend.PYTHON
    if config.backend == "tensorrt":
        config.platform = config.platform or _TENSORRT_PLATFORM
    elif config.backend == backend.ONNXRUNTIME:
        config.platform = config.platform or PLATFORM
    elif config.backend == "pytorch":
        config.platform = config.platform or _LIBTORCH_PLATFORMS[0]
    elif not config.backend and not config.platform and not filename and folder is not None:
        if "." not in config.name:
            raise ConfigError(f"Invalid model name: Could not determine backend for model '{config.name}' with no "
                              "backend in model configuration. Expected model name of the form 'model.<backend_name>'.")
        config.backend = config.name.split(".", 1)[1]


def _listing(folder: Path) -> list[str]:
    """The names in ``folder`` (none when it cannot be listed)."""
    try:
        return [child.name for child in folder.iterdir()]
    except OSError:
        return []


def complete_instances(config: mc.ModelConfig, gpus: int) -> None:
    """Default the version policy and instance groups (in place), as Triton's model configuration
    completes them: a group without a count has one instance (per GPU for KIND_GPU), or two
    (``DEFAULT_CPU_INSTANCES``) for KIND_CPU under the ONNX Runtime and TensorFlow backends.

    Raises:
        ConfigError: GPU instances without a usable GPU (or naming a missing one), or KIND_MODEL.
    """
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.instance_group:
        config.instance_group.add()
    for index, group in enumerate(config.instance_group):
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(range(gpus))
        if group.count < 1:
            group.count = (DEFAULT_CPU_INSTANCES if group.kind == mc.ModelInstanceGroup.KIND_CPU
                           and config.backend in DEFAULT_CPU_INSTANCES_BACKENDS else 1)
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and (not gpus or any(g >= gpus for g in group.gpus)):
            raise ConfigError(f"instance group '{group.name}' asks for GPUs {list(group.gpus)} but {gpus} are usable")
        if group.kind == mc.ModelInstanceGroup.KIND_MODEL and config.backend != backend.PYTHON:
            raise ConfigError("instance group kind KIND_MODEL is not supported by the onnxruntime backend")


def complete_tensors(config: mc.ModelConfig, inputs: Sequence[TensorDeclaration], outputs: Sequence[TensorDeclaration],
                     batchable: bool = True, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
    """Fill max_batch_size, inputs and outputs the configuration leaves out, from the interface (in place).

    ``batchable``: whether the backend lets auto-complete turn on batching (Triton's rule above, with
    ``default_max_batch_size``: ``--backend-config`` ``default-max-batch-size``),
    and, as Triton's onnxruntime backend does, ``dynamic_batching {}`` when ``max_batch_size > 1``
    and no scheduler is configured. Overridable initializers are left out, as Triton's
    onnxruntime backend leaves them (a configuration may declare them as optional inputs).
    """
    inputs = [t for t in inputs if not t.overridable]
    if (batchable and not config.input and not config.output and config.max_batch_size == 0
            and _batchable(inputs, outputs)):
        config.max_batch_size = default_max_batch_size
    if batchable and config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
        config.dynamic_batching.SetInParent()  # Triton's onnxruntime auto-complete turns the batcher on
    skip = 1 if config.max_batch_size > 0 else 0
    served_inputs, served_outputs = reserved_names(config)  # sequence controls and state: the server's own
    served_inputs |= batch_input_names(config)  # ragged batching's batch inputs (kserve_v2.scheduling.ragged)
    _complete_tensors(config.input, [t for t in inputs if t.name not in served_inputs], skip, add_missing=True)
    _complete_tensors(config.output, [t for t in outputs if t.name not in served_outputs], skip,
                      add_missing=not config.output)


def validate(config: mc.ModelConfig, inputs: Sequence[TensorDeclaration], outputs: Sequence[TensorDeclaration]) -> None:
    """Check a completed configuration against the model's interface, with the checks and texts of Triton's
    onnxruntime backend (``ValidateInputs`` / ``ValidateOutputs`` and ``CompareDimsSupported``).

    Raises:
        ConfigError: a number of required inputs (sequence controls and state included) other than the
            model's; an unknown tensor; a datatype, rank or fixed dim that differs; batching on a model
            without a variable first dim; a scalar tensor with dims other than 1; a tensor declared
            twice; an unsupported scheduler.
    """
    declared = {i.name: i for i in config.input}
    required = [t.name for t in inputs if t.overridable and t.name in declared and not declared[t.name].optional]
    if required:  # Triton's onnxruntime backend counts them out of the required inputs
        raise ConfigError(f"inputs {required} have an initializer in the model: the configuration must mark "
                          "them 'optional: true'")
    served_inputs, _ = reserved_names(config)
    served_inputs |= batch_input_names(config)
    if (problem := ragged_problem(config, inputs)) is not None:
        raise ConfigError(problem)
    expected = sum(not t.optional for t in config.input) + len(served_inputs)
    provided = sum(not t.optional for t in inputs)
    if expected != provided:
        raise ConfigError(f"unable to load model '{config.name}', configuration expects {expected} inputs, "
                          f"model provides {provided}")
    _validate_tensors(config, "input", config.input, inputs)
    _validate_tensors(config, "output", config.output, outputs)
    if config.HasField("ensemble_scheduling"):
        raise ConfigError("ensembles are not supported")
    if config.response_cache.enable and (config.HasField("sequence_batching") or config.model_transaction_policy.decoupled):
        scheduler = ("sequence batching scheduler" if config.HasField("sequence_batching")
                     else "'decoupled' transaction policy")  # Triton's texts (model_config_utils.cc)
        raise ConfigError(f"Response Cache does not currently support model {config.name} with {scheduler}. "
                          "Please disable the response cache.")
    too_large = [s for s in config.dynamic_batching.preferred_batch_size if s < 1 or s > config.max_batch_size]
    if config.HasField("dynamic_batching") and config.max_batch_size > 0 and too_large:
        raise ConfigError(f"dynamic batching preferred size must be <= max batch size for {config.name}: {too_large}")


def _batchable(inputs: Sequence[TensorDeclaration], outputs: Sequence[TensorDeclaration]) -> bool:
    tensors = list(inputs) + list(outputs)
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def _complete_tensors(declared: RepeatedCompositeFieldContainer[_Tensor], graph: Sequence[TensorDeclaration], skip: int, add_missing: bool) -> None:
    by_name = {t.name: t for t in graph}
    for tensor in declared:
        found = by_name.get(tensor.name)
        if found is None:
            continue
        if tensor.data_type == mc.TYPE_INVALID:
            tensor.data_type = _data_type(found)
        if not tensor.dims and not tensor.HasField("reshape"):
            tensor.dims.extend(found.shape[skip:])
    if add_missing:
        names = {t.name for t in declared}
        for found in graph:
            if found.name not in names:
                tensor = declared.add()
                tensor.name = found.name
                if found.optional and isinstance(tensor, mc.ModelInput):  # only inputs are optional
                    tensor.optional = True
                tensor.data_type = _data_type(found)
                tensor.dims.extend(found.shape[skip:])


def _data_type(found: TensorDeclaration) -> mc.DataType:
    """The config enum of a graph tensor's datatype (the generated stubs type ``Value`` as a plain int)."""
    return cast("mc.DataType", mc.DataType.Value(found.dtype.config))


def _validate_tensors(config: mc.ModelConfig, kind: str, declared: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput],
                      graph: Sequence[TensorDeclaration]) -> None:
    """Each declared tensor against the model's (Triton's onnxruntime backend texts)."""
    model = config.name
    by_name = {t.name: t for t in graph}
    seen: set[str] = set()
    for tensor in declared:
        if tensor.name in seen:
            raise ConfigError(f"{kind} '{tensor.name}' is declared twice")
        seen.add(tensor.name)
        found = by_name.get(tensor.name)
        if found is None:
            raise ConfigError(f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: "
                              f"{', '.join(sorted(by_name))}")
        expected = mc.DataType.Name(tensor.data_type)
        if expected != found.dtype.config:
            raise ConfigError(f"unable to load model '{model}', configuration expects datatype {expected} for {kind} "
                              f"'{tensor.name}', model provides TYPE_{found.dtype.v2}")
        if any(d < -1 for d in tensor.dims):
            raise ConfigError(f"{kind} '{tensor.name}' has an invalid dim in {list(tensor.dims)}")
        dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        if _ragged_io(config, tensor):  # shape checked by ragged_problem (ragged input) or free (batch output)
            continue
        if found.shape:
            _compare_dims(model, tensor.name, list(found.shape), dims, config.max_batch_size)
        elif any(d != 1 for d in dims):  # a scalar in the model (ONNX Runtime shows an unknown rank so too)
            raise ConfigError(f"unable to load model '{model}', scalar tensor '{tensor.name}', should only provide 1 in "
                              "the model configuration when the model doesn't support batching. Model configuration "
                              f"provided: {_dims_text(dims)}.")


def _ragged_io(config: mc.ModelConfig, tensor: mc.ModelInput | mc.ModelOutput) -> bool:
    """A ragged input, or a batch output's target: the model's shape is not the configured one (Triton's
    onnxruntime backend skips the dims check for both)."""
    if isinstance(tensor, mc.ModelInput):
        return tensor.allow_ragged_batch
    return any(tensor.name in b.target_name for b in config.batch_output)


def _compare_dims(model: str, name: str, model_shape: list[int], dims: list[int], max_batch_size: int) -> None:
    """Triton's ``CompareDimsSupported`` and texts: with batching the model's first dim must be -1 and the
    rest the config's dims. A -1 on either side matches any dim: Triton's backend also refuses a
    configured -1 for a fixed model dim, and for outputs a fixed configured dim for a -1 model dim."""
    if max_batch_size > 0:
        if model_shape[0] != -1:
            raise ConfigError(f"model '{model}', tensor '{name}': for the model to support batching the shape should "
                              "have at least 1 dimension and the first dimension must be -1; but shape expected by the "
                              f"model is {_dims_text(model_shape)}")
        full = [-1, *dims]
        if not _dims_match(model_shape, full):
            raise ConfigError(f"model '{model}', tensor '{name}': the model expects {len(model_shape)} dimensions "
                              f"(shape {_dims_text(model_shape)}) but the model configuration specifies {len(full)} "
                              "dimensions (an initial batch dimension because max_batch_size > 0 followed by the "
                              f"explicit tensor shape, making complete shape {_dims_text(full)})")
    elif not _dims_match(model_shape, dims):
        raise ConfigError(f"model '{model}', tensor '{name}': the model expects {len(model_shape)} dimensions (shape "
                          f"{_dims_text(model_shape)}) but the model configuration specifies {len(dims)} dimensions "
                          f"(shape {_dims_text(dims)})")


def _dims_match(model_shape: list[int], dims: list[int]) -> bool:
    return len(model_shape) == len(dims) and all(m == d for m, d in zip(model_shape, dims, strict=True)
                                                 if m != -1 and d != -1)


def _dims_text(dims: Sequence[int]) -> str:
    """Triton's ``ShapeToString``: ``[-1,16]``."""
    return "[" + ",".join(map(str, dims)) + "]"
