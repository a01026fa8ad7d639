"""ModelInferRequest -> model feeds, and model outputs -> ModelInferResponse.

Request checks follow Triton's semantics and texts (``shared/spec/triton-protocol-notes.md``
2.1, ``hardening-notes.md`` section 3); every error is INVALID_ARGUMENT unless noted. Responses
always carry data in ``raw_output_contents``, one entry per output, in output order (what
tritonclient's ``as_numpy`` reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend import Parameter
from kserve_v2.errors import InvalidInput, Unsupported
from kserve_v2.spec import ModelSpec, TensorSpec
from kserve_v2.tensors import element_count, from_contents, from_raw, to_raw

_SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
# Triton reserves this prefix and rejects keys it does not know; other parameters are passed over.
_RESERVED_PREFIX = "triton_"
# Reserved keys Triton accepts; perf_analyzer sends this one (it only matters for decoupled models).
_KNOWN_RESERVED = frozenset({"triton_enable_empty_final_response"})


@dataclass(slots=True)
class DecodedRequest:
    """A validated request: model-shaped feeds, outputs to return, the batch size and the
    request's own (non-reserved) parameters."""

    feeds: dict[str, np.ndarray]
    outputs: list[TensorSpec]
    batch_size: int
    parameters: dict[str, Parameter]


def decode_request(request: pb.ModelInferRequest, spec: ModelSpec) -> DecodedRequest:
    """Validate a request against the model and decode its tensors.

    Raises:
        InvalidInput: unknown, duplicate or missing inputs; datatype or shape mismatch;
            contents and raw both used; raw count differing from the inputs; byte size or
            element count mismatch; unknown or duplicate outputs; reserved parameters.
        Unsupported: the classification extension -> UNIMPLEMENTED.
    """
    parameters: dict[str, Parameter] = {}
    for key, value in request.parameters.items():
        if key.startswith(_RESERVED_PREFIX):
            if key not in _KNOWN_RESERVED:
                raise InvalidInput(f"parameter '{key}' is reserved and not recognised")
            continue
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            parameters[key] = getattr(value, choice)
    feeds = _decode_inputs(request, spec)
    batch_size = _batch_size(feeds, spec)
    for tensor in spec.inputs:
        if tensor.reshape is not None and tensor.name in feeds:
            feeds[tensor.name] = _reshape(feeds[tensor.name], tensor.reshape, spec, tensor.name)
    return DecodedRequest(feeds, _requested_outputs(request, spec), batch_size, parameters)


def encode_response(
    request: pb.ModelInferRequest, spec: ModelSpec, version: int, outputs: list[TensorSpec], arrays: list[np.ndarray]
) -> pb.ModelInferResponse:
    """Build the response: ``outputs[i]`` described in ``outputs`` and carried in ``raw_output_contents[i]``."""
    response = pb.ModelInferResponse(model_name=spec.name, model_version=str(version), id=request.id)
    for tensor, array in zip(outputs, arrays, strict=True):
        if tensor.reshape is not None and list(tensor.dims).count(-1) <= 1:
            batch = [array.shape[0]] if spec.max_batch_size > 0 and array.ndim else []
            array = array.reshape(batch + list(tensor.dims))
        response.outputs.add(name=tensor.name, datatype=tensor.dtype.v2, shape=array.shape)
        response.raw_output_contents.append(to_raw(array, tensor.dtype))
    return response


def _decode_inputs(request: pb.ModelInferRequest, spec: ModelSpec) -> dict[str, np.ndarray]:
    by_name = {t.name: t for t in spec.inputs}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"expected {len(request.inputs)} entries in raw_input_contents (one per input) "
            f"for model '{spec.name}', got {len(raw)}"
        )
    feeds: dict[str, np.ndarray] = {}
    for index, sent in enumerate(request.inputs):
        tensor = by_name.get(sent.name)
        if tensor is None:
            raise InvalidInput(f"unexpected inference input '{sent.name}' for model '{spec.name}'")
        if sent.name in feeds:
            raise InvalidInput(f"input '{sent.name}' appears more than once in the request for model '{spec.name}'")
        for key in _SHM_PARAMETERS:
            if key in sent.parameters:
                raise InvalidInput(
                    f"input '{sent.name}' names a shared memory region, but client shared memory is disabled"
                )
        if sent.datatype != tensor.dtype.v2:
            raise InvalidInput(
                f"inference input '{sent.name}' data-type is '{sent.datatype}', "
                f"but model '{spec.name}' expects '{tensor.dtype.v2}'"
            )
        shape = list(sent.shape)
        spec.check_shape(tensor, shape)
        what = f"input '{sent.name}' for model '{spec.name}'"
        if raw:
            if sent.HasField("contents"):
                raise InvalidInput(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{sent.name}' for model '{spec.name}'"
                )
            feeds[sent.name] = from_raw(raw[index], tensor.dtype, shape, what)
        else:
            feeds[sent.name] = _from_typed_contents(sent, tensor, shape, what)
    missing = [t.name for t in spec.inputs if t.name not in feeds and not t.optional]
    if missing:
        raise InvalidInput(
            f"expected {len(spec.inputs)} inputs but got {len(feeds)} inputs for model '{spec.name}'. "
            f"Got input(s) {sorted(feeds)}, but missing required input(s) {missing}. "
            "Please provide all required input(s)."
        )
    return feeds


def _from_typed_contents(sent: pb.ModelInferRequest.InferInputTensor, tensor: TensorSpec, shape: list[int], what: str) -> np.ndarray:
    field = tensor.dtype.contents_field
    used = [f.name for f, _ in sent.contents.ListFields()]
    if field is None:
        raise InvalidInput(f"{tensor.dtype.v2} data of {what} must be sent in raw_input_contents")
    if not sent.HasField("contents") and element_count(shape, what):
        raise InvalidInput(f"{what} has no data: send it in raw_input_contents or contents.{field}")
    if any(name != field for name in used):
        raise InvalidInput(f"{tensor.dtype.v2} data of {what} goes in contents.{field}, not {', '.join(used)}")
    return from_contents(getattr(sent.contents, field), tensor.dtype, shape, what)


def _batch_size(feeds: dict[str, np.ndarray], spec: ModelSpec) -> int:
    if spec.max_batch_size == 0:
        return 1
    sizes = {name: array.shape[0] for name, array in feeds.items()}
    if len(set(sizes.values())) > 1:
        raise InvalidInput(f"inputs of one request for model '{spec.name}' have different batch sizes: {sizes}")
    return next(iter(sizes.values()), 0)


def _reshape(array: np.ndarray, reshape: tuple[int, ...], spec: ModelSpec, name: str) -> np.ndarray:
    target = ([array.shape[0]] if spec.max_batch_size > 0 else []) + list(reshape)
    try:
        return array.reshape(target)
    except ValueError:
        raise InvalidInput(f"input '{name}' of shape {list(array.shape)} cannot take the model's reshape {list(reshape)}") from None


def _requested_outputs(request: pb.ModelInferRequest, spec: ModelSpec) -> list[TensorSpec]:
    if not request.outputs:
        return list(spec.outputs)
    by_name = {t.name: t for t in spec.outputs}
    chosen: list[TensorSpec] = []
    for wanted in request.outputs:
        tensor = by_name.get(wanted.name)
        if tensor is None:
            raise InvalidInput(f"unexpected inference output '{wanted.name}' for model '{spec.name}'")
        if tensor in chosen:
            raise InvalidInput(f"output '{wanted.name}' is requested more than once for model '{spec.name}'")
        if "classification" in wanted.parameters:
            raise Unsupported("the classification extension is not supported")
        if any(key in wanted.parameters for key in _SHM_PARAMETERS):
            raise InvalidInput(
                f"output '{wanted.name}' names a shared memory region, but client shared memory is disabled"
            )
        chosen.append(tensor)
    return chosen
