"""Model outputs -> ModelInferResponse, the counterpart of ``kserve_v2.inference``.

Responses always carry data in ``raw_output_contents``, one entry per output, in output order
(what tritonclient's ``as_numpy`` reads); an output written to system shared memory has an empty
entry and its ``shared_memory_*`` parameters (Triton's ``infer_handler.cc``). Outputs requested
as classes are written as Triton's classification extension gives them (``kserve_v2.classification``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from kserve_v2 import classification
from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend import Parameter
from kserve_v2.datatypes import BYTES
from kserve_v2.errors import InvalidInput
from kserve_v2.inference import DecodedRequest
from kserve_v2.shared_memory import RegionRange
from kserve_v2.spec import MAX_MEMO, ModelSpec, TensorSpec
from kserve_v2.tensors import pack_bytes, to_raw


def set_parameter(target: pb.InferParameter, value: Parameter) -> None:
    """Write a parameter value into its ``InferParameter`` field: bool, int64 (uint64 above
    int64's range), double or string."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = value


def encode_response(request: pb.ModelInferRequest, spec: ModelSpec, version: int, decoded: DecodedRequest,
                    arrays: list[np.ndarray], raw: bool = True, parameters: Mapping[str, Parameter] | None = None
                    ) -> tuple[pb.ModelInferResponse, list[np.ndarray]]:
    """Build the response: ``outputs[i]`` described in ``decoded.outputs`` and carried in
    ``raw_output_contents[i]``, or written into its shared memory region; ``parameters``: the
    response's own parameters, if any.

    Returns:
        (response, the output arrays in the shapes the response gives). With ``raw`` false the
        response has no ``raw_output_contents``: the caller writes the arrays itself (REST sends
        them from their own buffers).

    Raises:
        InvalidInput: an output larger than its shared memory range.
    """
    shaped = arrays
    outputs = decoded.outputs
    for i, tensor in enumerate(outputs):
        if tensor.reshape is not None and list(tensor.dims).count(-1) <= 1:
            array = arrays[i]
            batch = [array.shape[0]] if spec.max_batch_size > 0 and array.ndim else []
            if shaped is arrays:
                shaped = list(arrays)
            shaped[i] = array.reshape(batch + list(tensor.dims))
    if decoded.classes:  # outputs asked for as classes become BYTES (Triton's classification extension)
        shaped, outputs = list(shaped), list(outputs)
        for i, tensor in enumerate(outputs):
            count = decoded.classes.get(tensor.name)
            if count is not None:
                shaped[i] = classification.classify(shaped[i], count, spec.max_batch_size > 0, tensor.labels)
                outputs[i] = replace(tensor, dtype=BYTES, reshape=None)
    response = pb.ModelInferResponse.FromString(_description(spec, version, decoded, outputs, shaped))
    if request.id:
        response.id = request.id
    if parameters:
        for key, given in parameters.items():
            set_parameter(response.parameters[key], given)
    placed = decoded.output_memory
    if placed:
        contents: list[bytes] = []
        for tensor, array, out in zip(outputs, shaped, response.outputs[:], strict=True):
            if tensor.name in placed:
                target, described = placed[tensor.name]
                _write(target, array, tensor)
                for key, value in described.parameters.items():
                    out.parameters[key].CopyFrom(value)
                contents.append(b"")
            elif raw:
                contents.append(to_raw(array, tensor.dtype))
        if raw:
            response.raw_output_contents.extend(contents)
    elif raw:
        response.raw_output_contents.extend([to_raw(a, t.dtype) for t, a in zip(outputs, shaped, strict=True)])
    return response, shaped


def _description(spec: ModelSpec, version: int, decoded: DecodedRequest, outputs: Sequence[TensorSpec],
                 arrays: list[np.ndarray]) -> bytes:
    """The serialized response without ``id`` and data: the model, its version and each output's
    name, datatype and shape (kept in ``spec.responses``, at most ``MAX_MEMO``)."""
    key: Hashable = (version, decoded.output_names, tuple([array.shape for array in arrays]))
    if decoded.classes:
        key = (key, tuple(decoded.classes))
    described = spec.responses.get(key)
    if described is None:
        response = pb.ModelInferResponse(model_name=spec.name, model_version=str(version))
        for tensor, array in zip(outputs, arrays, strict=True):
            response.outputs.add(name=tensor.name, datatype=tensor.dtype.v2, shape=array.shape)
        described = response.SerializeToString()
        if len(spec.responses) >= MAX_MEMO:
            spec.responses.clear()
        spec.responses[key] = described
    return described


def _write(target: RegionRange, array: np.ndarray, tensor: TensorSpec) -> None:
    """Copy an output into its shared memory range (one copy; BYTES with their length prefixes)."""
    data = np.frombuffer(pack_bytes(array), np.uint8) if tensor.dtype is BYTES else np.ascontiguousarray(array)
    if data.nbytes > target.byte_size:
        raise InvalidInput(f"shared memory size specified with the request for output '{tensor.name}' "
                           f"({target.byte_size} bytes) should be at least {data.nbytes} bytes to hold the results")
    target.write(data.reshape(-1).view(np.uint8).data)
