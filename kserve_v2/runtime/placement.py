"""Where a model's instances run, and what ONNX Runtime's CUDA execution provider is given: pure
functions of a completed configuration, the number of usable GPUs an argument.

Placement is Triton's model lifecycle (``TritonModelInstance::CreateInstances`` in Triton's core;
the model configuration docs, "Instance Groups"): for each instance group in order, ``count``
instances named ``<group>_<index>`` (index 0 .. count-1); a ``KIND_GPU`` group makes each of them
on EVERY GPU its ``gpus`` lists (``count`` instances per GPU; an empty ``gpus`` means every usable
GPU, which ``repository.config.complete_instances`` fills in), so instances on different GPUs share
a name, as in Triton; any other group makes its ``count`` on the CPU (device 0).

The CUDA provider options are those Triton's onnxruntime backend reads from the model
configuration's ``parameters`` and passes to ONNX Runtime's CUDA execution provider (its README,
"ONNX Runtime with CUDA Execution Provider optimization", "Deprecated Parameters"), plus the
``device_id`` of the instance's GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.instance_groups import KIND_GPU, Instance, instances

# Triton's parameter -> (the CUDA execution provider option, Triton's value -> ONNX Runtime's value)
_CONV_ALGO_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
_ARENA_EXTEND_STRATEGY = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}
_FLAG = {"0": "0", "1": "1"}
_SIZE_MAX = 2**64 - 1  # gpu_mem_limit is a size_t; Triton's README: "To use all possible memory pass in maximum size_t"
CUDA_PARAMETERS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")


def plan(groups: Sequence[mc.ModelInstanceGroup], gpus: int) -> list[Instance]:
    """The instances of completed instance groups, in Triton's order: group by group, index by
    index, and for a KIND_GPU group each of its GPUs in the order ``gpus`` lists them.

    Args:
        groups: the completed instance groups (``repository.config.complete_instances``).
        gpus: the number of usable GPUs (``runtime.device.cuda_device_count``); an empty ``gpus``
            of a KIND_GPU group means all of them.

    Raises:
        ValueError: a KIND_GPU group naming a GPU that is not usable (the text of
            ``complete_instances``; the load fails with it).
    """
    completed = []
    for group in groups:
        devices = list(group.gpus) or list(range(gpus))
        if group.kind == KIND_GPU and (not devices or any(not 0 <= d < gpus for d in devices)):
            raise ValueError(f"instance group '{group.name}' asks for GPUs {list(group.gpus)} but {gpus} are usable")
        if group.kind == KIND_GPU and not group.gpus:
            filled = mc.ModelInstanceGroup()
            filled.CopyFrom(group)
            filled.gpus.extend(devices)
            group = filled
        completed.append(group)
    return [placed for _, placed in instances(completed)]


def cuda_parameters(parameters: Mapping[str, str]) -> list[str]:
    """The CUDA provider parameters (``CUDA_PARAMETERS``) a configuration's ``parameters`` set, in that order."""
    return [key for key in CUDA_PARAMETERS if key in parameters]


def cuda_provider_options(parameters: Mapping[str, str], device: int) -> dict[str, str]:
    """The options of ONNX Runtime's CUDA execution provider for an instance on GPU ``device``.

    From the configuration's ``parameters`` (Triton's onnxruntime backend README, "Deprecated
    Parameters"), each when set: ``cudnn_conv_algo_search`` 0 EXHAUSTIVE (ONNX Runtime's default),
    1 HEURISTIC, 2 DEFAULT; ``gpu_mem_limit``: the CUDA memory arena's limit in bytes (0 ..
    2**64-1, ONNX Runtime's default the maximum); ``arena_extend_strategy`` 0 kNextPowerOfTwo (the
    default), 1 kSameAsRequested; ``do_copy_in_default_stream`` 1 copies on the compute stream (the
    default), 0 on a stream of their own.

    Returns:
        ``device_id`` and the options set, by ONNX Runtime's names and values.

    Raises:
        ValueError: a value outside those ("parameter '<key>' of the CUDA execution provider must be
            ..., got '<value>'"); the model's load fails with it (RepositoryModelLoad: INTERNAL, HTTP 400).
    """
    options = {"device_id": str(device)}
    for key, choices in (("cudnn_conv_algo_search", _CONV_ALGO_SEARCH),
                         ("arena_extend_strategy", _ARENA_EXTEND_STRATEGY), ("do_copy_in_default_stream", _FLAG)):
        if key in parameters:
            value = parameters[key].strip()
            if value not in choices:
                allowed = ", ".join(f"{number} ({name})" if name != number else number for number, name in choices.items())
                raise ValueError(f"parameter '{key}' of the CUDA execution provider must be one of {allowed}, "
                                 f"got '{parameters[key]}'")
            options[key] = choices[value]
    if "gpu_mem_limit" in parameters:
        text = parameters["gpu_mem_limit"].strip()
        if not (text.isascii() and text.isdigit()) or int(text) > _SIZE_MAX:
            raise ValueError(f"parameter 'gpu_mem_limit' of the CUDA execution provider must be a number of bytes "
                             f"from 0 to {_SIZE_MAX}, got '{parameters['gpu_mem_limit']}'")
        options["gpu_mem_limit"] = str(int(text))
    return options


def no_cuda_reason(cuda_provider: bool, gpus: int) -> str:
    """Why no instance runs on the CUDA execution provider: ``cuda_provider``, whether ONNX Runtime
    has it (``onnxruntime.get_available_providers``); ``gpus``, the usable GPUs."""
    if not cuda_provider:
        return "this ONNX Runtime has no CUDA execution provider (a CPU-only build)"
    if not gpus:
        return "no GPU is usable"
    return "its instances are in KIND_CPU groups"
