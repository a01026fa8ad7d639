"""What this server does with every field of a model's ``config.pbtxt`` (``ModelConfig``, Triton's
``model_config.proto``), so that no field is ignored in silence.

Each field path (``instance_group.rate_limiter.priority``: message fields joined by dots, repeated
fields and map values without an index) is in exactly one of three tables:

- ``ACTED``: this server acts on it (the value is where the module named does something with it);
- ``REFUSED``: Triton's core or its onnxruntime / python backends act on it and this server does
  not: a configuration that sets it fails to load, with a text that names the field;
- ``WARNED``: only backends this server does not run (TensorRT, TensorFlow, ...) read it, or it
  changes where and how memory is placed, never a result: a configuration that sets it loads, with
  one warning per load that names the field.

A path under a refused or warned message needs no row of its own (the message is refused or
warned as a whole); every path under an acted-on message has its row, so that a field that a new
``model_config.proto`` adds cannot slip through (``tests/static/test_config_fields.py`` walks the
descriptor). "Set" is protobuf's presence: a message or ``optional`` field that is present, a
non-empty repeated field or map, a scalar other than its default.
"""

from __future__ import annotations

import logging
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kserve_v2._proto import model_config_pb2 as mc

log = logging.getLogger(__name__)

ACTED: dict[str, str] = {
    "name": "repository.config.read_config: must match the folder",
    "platform": "repository.config: onnxruntime_onnx and ensemble",
    "backend": "repository.config / kserve_v2.backend.find",
    "version_policy": "repository.layout.select_versions",
    "version_policy.latest": "repository.layout.select_versions",
    "version_policy.latest.num_versions": "repository.layout.select_versions",
    "version_policy.all": "repository.layout.select_versions",
    "version_policy.specific": "repository.layout.select_versions",
    "version_policy.specific.versions": "repository.layout.select_versions",
    "max_batch_size": "protocol.model_spec, the schedulers",
    "input": "protocol.model_spec, repository.config.validate",
    "input.name": "protocol.model_spec",
    "input.data_type": "protocol.model_spec",
    "input.format": "repository.config_fields.check: NHWC / NCHW need 3 dims (Triton's check); else informational",
    "input.dims": "protocol.model_spec",
    "input.reshape": "request.decode",
    "input.reshape.shape": "request.decode",
    "input.optional": "request.decode",
    "output": "protocol.model_spec, repository.config.validate",
    "output.name": "protocol.model_spec",
    "output.data_type": "protocol.model_spec",
    "output.dims": "protocol.model_spec",
    "output.reshape": "request.encode",
    "output.reshape.shape": "request.encode",
    "input.allow_ragged_batch": "scheduling.ragged",
    "batch_input": "scheduling.ragged, repository.config.validate",
    "batch_input.kind": "scheduling.ragged",
    "batch_input.target_name": "scheduling.ragged",
    "batch_input.data_type": "scheduling.ragged",
    "batch_input.source_input": "scheduling.ragged",
    "batch_output": "scheduling.ragged, repository.config.validate",
    "batch_output.target_name": "scheduling.ragged",
    "batch_output.kind": "scheduling.ragged",
    "batch_output.source_input": "scheduling.ragged",
    "output.label_filename": "repository.loader.read_labels, request.classification",
    "optimization": "runtime.onnx",
    "optimization.graph": "runtime.onnx.session_options",
    "optimization.graph.level": "runtime.onnx.session_options",
    "optimization.execution_accelerators": "runtime.onnx.cpu_accelerators",
    "optimization.execution_accelerators.cpu_execution_accelerator": "runtime.onnx.cpu_accelerators",
    "optimization.execution_accelerators.cpu_execution_accelerator.name": "runtime.onnx.cpu_accelerators",
    "optimization.execution_accelerators.cpu_execution_accelerator.parameters": "runtime.onnx.cpu_accelerators",
    "dynamic_batching": "scheduling.dynamic_batcher",
    "dynamic_batching.preferred_batch_size": "scheduling.dynamic_batcher",
    "dynamic_batching.max_queue_delay_microseconds": "scheduling.dynamic_batcher",
    "dynamic_batching.preserve_ordering": "scheduling.dynamic_batcher",
    "dynamic_batching.priority_levels": "scheduling.dynamic_batcher (request priorities)",
    "dynamic_batching.default_priority_level": "scheduling.dynamic_batcher (request priorities)",
    "dynamic_batching.default_queue_policy": "scheduling.dynamic_batcher",
    "dynamic_batching.default_queue_policy.timeout_action": "scheduling.dynamic_batcher",
    "dynamic_batching.default_queue_policy.default_timeout_microseconds": "scheduling.dynamic_batcher",
    "dynamic_batching.default_queue_policy.allow_timeout_override": "scheduling.dynamic_batcher",
    "dynamic_batching.default_queue_policy.max_queue_size": "scheduling.dynamic_batcher",
    "dynamic_batching.priority_queue_policy": "scheduling.dynamic_batcher (request priorities)",
    "dynamic_batching.priority_queue_policy.timeout_action": "scheduling.dynamic_batcher",
    "dynamic_batching.priority_queue_policy.default_timeout_microseconds": "scheduling.dynamic_batcher",
    "dynamic_batching.priority_queue_policy.allow_timeout_override": "scheduling.dynamic_batcher",
    "dynamic_batching.priority_queue_policy.max_queue_size": "scheduling.dynamic_batcher",
    "sequence_batching": "scheduling.sequence_config, scheduling.sequence_batcher",
    "sequence_batching.direct": "scheduling.sequence_config",
    "sequence_batching.direct.max_queue_delay_microseconds": "scheduling.sequence_config",
    "sequence_batching.oldest": "scheduling.sequence_config",
    "sequence_batching.oldest.max_candidate_sequences": "scheduling.sequence_config",
    "sequence_batching.oldest.preferred_batch_size": "scheduling.sequence_config",
    "sequence_batching.oldest.max_queue_delay_microseconds": "scheduling.sequence_config",
    "sequence_batching.max_sequence_idle_microseconds": "scheduling.sequence_config",
    "sequence_batching.iterative_sequence": "scheduling.sequence_batcher: ids for requests without one, rescheduling",
    "sequence_batching.control_input": "scheduling.sequence_config",
    "sequence_batching.control_input.name": "scheduling.sequence_config",
    "sequence_batching.control_input.control": "scheduling.sequence_config",
    "sequence_batching.control_input.control.kind": "scheduling.sequence_config",
    "sequence_batching.control_input.control.int32_false_true": "scheduling.sequence_config",
    "sequence_batching.control_input.control.fp32_false_true": "scheduling.sequence_config",
    "sequence_batching.control_input.control.bool_false_true": "scheduling.sequence_config",
    "sequence_batching.control_input.control.data_type": "scheduling.sequence_config",
    "sequence_batching.state": "scheduling.sequence_config",
    "sequence_batching.state.input_name": "scheduling.sequence_config",
    "sequence_batching.state.output_name": "scheduling.sequence_config",
    "sequence_batching.state.data_type": "scheduling.sequence_config",
    "sequence_batching.state.dims": "scheduling.sequence_config",
    "sequence_batching.state.initial_state": "scheduling.sequence_config",
    "sequence_batching.state.initial_state.data_type": "scheduling.sequence_config",
    "sequence_batching.state.initial_state.dims": "scheduling.sequence_config",
    "sequence_batching.state.initial_state.zero_data": "scheduling.sequence_config",
    "sequence_batching.state.initial_state.data_file": "scheduling.sequence_config",
    "sequence_batching.state.initial_state.name": "scheduling.sequence_config",
    "ensemble_scheduling": "scheduling.ensemble",
    "ensemble_scheduling.step": "scheduling.ensemble",
    "ensemble_scheduling.step.model_name": "scheduling.ensemble",
    "ensemble_scheduling.step.model_version": "scheduling.ensemble",
    "ensemble_scheduling.step.input_map": "scheduling.ensemble",
    "ensemble_scheduling.step.output_map": "scheduling.ensemble",
    "instance_group": "repository.config.complete_instances, scheduling.instances",
    "instance_group.name": "repository.config.complete_instances",
    "instance_group.kind": "repository.config.complete_instances, runtime.placement.plan",
    "instance_group.count": "scheduling.instances.instance_count, runtime.placement.plan",
    "instance_group.gpus": "runtime.placement.plan: count instances on each GPU listed, each session on its GPU "
                           "(runtime.onnx.open_sessions); logged as having no effect on a KIND_CPU group",
    "instance_group.rate_limiter": "scheduling.rate_limiter (with --rate-limit execution_count)",
    "instance_group.rate_limiter.resources": "scheduling.rate_limiter",
    "instance_group.rate_limiter.resources.name": "scheduling.rate_limiter",
    "instance_group.rate_limiter.resources.global": "scheduling.rate_limiter",
    "instance_group.rate_limiter.resources.count": "scheduling.rate_limiter",
    "instance_group.rate_limiter.priority": "scheduling.rate_limiter",
    "default_model_filename": "runtime.onnx, runtime.python",
    "parameters": "runtime.onnx.session_options, runtime.placement.cuda_provider_options (logged as having no "
                  "effect without a GPU instance); the python backend's model_config",
    "parameters.string_value": "runtime.onnx.session_options, runtime.placement.cuda_provider_options; the python "
                               "backend's model_config",
    "model_warmup": "models.warmup",
    "model_warmup.name": "models.warmup",
    "model_warmup.batch_size": "models.warmup",
    "model_warmup.inputs": "models.warmup",
    "model_warmup.inputs.data_type": "models.warmup",
    "model_warmup.inputs.dims": "models.warmup",
    "model_warmup.inputs.zero_data": "models.warmup",
    "model_warmup.inputs.random_data": "models.warmup",
    "model_warmup.inputs.input_data_file": "models.warmup",
    "model_warmup.count": "models.warmup",
    "model_transaction_policy": "backend.decoupled, runtime.python",
    "model_transaction_policy.decoupled": "backend.decoupled, runtime.python",
    "response_cache": "the response cache (--cache-config)",
    "response_cache.enable": "the response cache (--cache-config)",
}

REFUSED: dict[str, str] = {
    "runtime": "Triton's core loads the backend library or python-based backend it names; this server runs "
               "its built-in backends",
    "input.is_shape_tensor": "shape tensors are only supported for TensorRT platform",
    "output.is_shape_tensor": "shape tensors are only supported for TensorRT platform",
    "input.is_non_linear_format_io": "Non-linear IO format is only supported for the TensorRT platform",
    "output.is_non_linear_format_io": "Non-linear IO format is only supported for the TensorRT platform",
    "sequence_batching.direct.minimum_slot_utilization": "Triton's sequence batcher waits for that share of "
        "the slots to be filled; this server's does not",
    "sequence_batching.oldest.preserve_ordering": "Triton's sequence batcher returns responses in request "
        "order; this server's does not",
    "ensemble_scheduling.step.model_namespace": "model namespacing (--model-namespacing) is not implemented",
    "ensemble_scheduling.max_inflight_requests": "Triton's ensemble scheduler caps in-flight requests per "
        "step; this server's does not",
    "instance_group.passive": "passive instances (loaded, never scheduled) are not implemented",
    "model_operations": "Triton's onnxruntime backend loads these custom-operator libraries; this server "
        "loads none",
    "model_repository_agents": "repository agents (checksum, encryption) are not implemented",
}

WARNED: dict[str, str] = {
    "optimization.priority": "a TensorRT / TensorFlow backend setting (stream priority)",
    "optimization.cuda": "a TensorRT backend setting (CUDA graphs, busy-wait events, output copy stream)",
    "optimization.input_pinned_memory": "pinned host buffers of Triton's core for GPU copies; "
                                        "this server's ONNX Runtime copies through its own",
    "optimization.output_pinned_memory": "pinned host buffers of Triton's core for GPU copies; "
                                         "this server's ONNX Runtime copies through its own",
    "optimization.gather_kernel_buffer_threshold": "a TensorRT backend setting (GPU gather kernel)",
    "optimization.eager_batching": "a TensorRT backend setting",
    "sequence_batching.state.use_same_buffer_for_input_output": "a state buffer strategy of backends that "
        "write state in place (TensorRT); results are the same without it",
    "sequence_batching.state.use_growable_memory": "a state buffer strategy of backends that write state in "
        "place (TensorRT, KIND_GPU); results are the same without it",
    "instance_group.secondary_devices": "a TensorRT backend setting (NVDLA devices)",
    "instance_group.profile": "a TensorRT backend setting (optimization profiles)",
    "instance_group.host_policy": "Triton applies it with --host-policy (NUMA binding), which this server "
                                  "does not have",
    "cc_model_filenames": "a TensorRT backend setting (model file per compute capability)",
    # serving is the same without these; a GPU host's TensorRT tuning is its own issue
    "optimization.execution_accelerators.gpu_execution_accelerator": "Triton's onnxruntime backend runs the "
        "TensorRT / CUDA execution providers it names on GPU instances; this server runs ONNX Runtime's plain "
        "CUDA provider there",
    "metric_tags": "Triton's core adds these labels to the model's metrics; this server does not",
    "model_metrics": "per-model metric histograms (model_metrics) are not implemented",
}

# NHWC / NCHW are an image layout the tensor must have three dims for (Triton's ValidateModelInput)
_IMAGE_FORMATS = (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)


class UnsupportedField(ValueError):
    """A configuration sets a field of ``REFUSED`` (or breaks the check of an ``ACTED`` one); the model
    fails to load with this text (RepositoryModelLoad: INTERNAL, HTTP 400, as every load failure)."""


def set_paths(message: Message, prefix: str = "") -> list[str]:
    """The paths of every field set in ``message`` and, below them, in the messages it holds (each path
    once, in descriptor order); a path under ``REFUSED`` or ``WARNED`` rows is not descended into."""
    found: list[str] = []
    for descriptor, value in message.ListFields():
        path = prefix + descriptor.name
        if path not in found:
            found.append(path)
        if path in REFUSED or path in WARNED or descriptor.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        for held in _held_messages(descriptor, value):
            found.extend(p for p in set_paths(held, path + ".") if p not in found)
    return found


def _held_messages(descriptor: FieldDescriptor, value: Any) -> list[Message]:
    """The messages a set message field holds: itself, a repeated field's elements, a map's message values."""
    if descriptor.message_type.GetOptions().map_entry:
        return [held for held in value.values() if isinstance(held, Message)]
    if descriptor.is_repeated:
        return list(value)
    return [value]


def check(config: mc.ModelConfig) -> list[str]:
    """Check a configuration as it was written (before auto-complete) against the tables.

    Returns:
        The paths of the ``WARNED`` fields it sets (logged once here, as a warning naming each).

    Raises:
        UnsupportedField: it sets a ``REFUSED`` field ("model '<m>': config field '<path>' is not
            supported by this server: <reason>"), or an input with ``format`` NHWC / NCHW has other
            than 3 dims (Triton's "model input NHWC/NCHW require 3 dims").
    """
    paths = set_paths(config)
    for path in paths:
        if path in REFUSED:
            raise UnsupportedField(f"model '{config.name}': config field '{path}' is not supported by this "
                                   f"server: {REFUSED[path]}")
    for tensor in config.input:
        if tensor.format in _IMAGE_FORMATS and len(tensor.dims) != 3:
            raise UnsupportedField(f"model '{config.name}': input '{tensor.name}': model input NHWC/NCHW "
                                   "require 3 dims")
    warned = [path for path in paths if path in WARNED]
    for path in warned:
        log.warning("model '%s': config field '%s' has no effect on this server: %s", config.name, path,
                    WARNED[path])
    return warned
