"""Model outputs -> ModelInferResponse, the counterpart of ``kserve_v2.request.decode``.

Responses always carry data in ``raw_output_contents``, one entry per output, in output order
(what tritonclient's ``as_numpy`` reads), each entry a view of the output array's own buffer (no
copy; BYTES framed once): the transport copies it once, into the message it sends. An output
written to system shared memory has an empty entry and its ``shared_memory_*`` parameters
(Triton's ``infer_handler.cc``). Outputs requested as classes are written as Triton's
classification extension gives them (``kserve_v2.request.classification``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from kserve_v2.backend import Parameter
from kserve_v2.codec.messages import Buffer, InferRequest, InferResponse, OutputTensor, parameter
from kserve_v2.codec.responses import encode_head
from kserve_v2.protocol.datatypes import BY_NUMPY, BYTES
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.model_spec import MAX_MEMO, ModelSpec, TensorSpec
from kserve_v2.protocol.tensors import as_buffer
from kserve_v2.request import classification
from kserve_v2.request.decode import DecodedRequest
from kserve_v2.request.shared_memory import RegionRange


def encode_response(request: InferRequest, spec: ModelSpec, version: int, decoded: DecodedRequest,
                    arrays: list[np.ndarray], raw: bool = True, parameters: Mapping[str, Parameter] | None = None
                    ) -> tuple[InferResponse, list[np.ndarray]]:
    """Build the response: ``outputs[i]`` described in ``decoded.outputs`` and carried in
    ``raw_output_contents[i]`` (a view of the array's buffer), or written into its shared memory
    region; ``parameters``: the response's own parameters, if any. An output whose array has another
    numpy type than the declared one is described with its array's datatype (``_retyped``).

    Returns:
        (response, the output arrays in the shapes the response gives). With ``raw`` false the
        response has no ``raw_output_contents``: the caller writes the arrays itself (REST sends
        them from their own buffers, or as JSON).

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
    retyped = _retyped(outputs, shaped)
    if retyped is not None:
        outputs = retyped
    head, described = _description(spec, version, decoded, outputs, shaped, retyped is not None)
    response = InferResponse(spec.name, str(version), request.id,
                             {key: parameter(value) for key, value in parameters.items()} if parameters else None,
                             described, None, head)
    placed = decoded.output_memory
    contents: list[Buffer] = response.raw_output_contents
    if placed:
        response.outputs, response.head = list(described), None  # the placed outputs name their range
        for i, (tensor, array) in enumerate(zip(outputs, shaped, strict=True)):
            if tensor.name in placed:
                target, named = placed[tensor.name]
                _write(target, array, tensor)
                out = described[i]
                response.outputs[i] = OutputTensor(out.name, out.datatype, out.shape, dict(named))
                contents.append(b"")
            elif raw:
                contents.append(as_buffer(array, tensor.dtype))
    elif raw:
        contents.extend([as_buffer(a, t.dtype) for t, a in zip(outputs, shaped, strict=True)])
    return response, shaped


def _retyped(outputs: Sequence[TensorSpec], arrays: Sequence[np.ndarray]) -> list[TensorSpec] | None:
    """The outputs, each with its array's datatype where the backend gave another numpy type than the
    declared one (a python model may: Triton answers with the datatype the model produced); None
    when every array has its declared type (BYTES: any object, bytes or str array)."""
    retyped: list[TensorSpec] | None = None
    for i, (tensor, array) in enumerate(zip(outputs, arrays, strict=True)):
        if array.dtype == tensor.dtype.numpy or (tensor.dtype is BYTES and array.dtype.kind in "OSU"):
            continue
        found = BYTES if array.dtype.kind in "OSU" else BY_NUMPY.get(
            array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
        if found is None or found is tensor.dtype:
            continue
        if retyped is None:
            retyped = list(outputs)
        retyped[i] = replace(tensor, dtype=found)
    return retyped


def _description(spec: ModelSpec, version: int, decoded: DecodedRequest, outputs: Sequence[TensorSpec],
                 arrays: list[np.ndarray], retyped: bool = False) -> tuple[bytes, tuple[OutputTensor, ...]]:
    """The response's model, version and outputs (each one's name, datatype and shape), encoded and
    as objects (kept in ``spec.responses``, at most ``MAX_MEMO``)."""
    key: Hashable = (version, decoded.output_names, tuple([array.shape for array in arrays]))
    if decoded.classes:
        key = (key, tuple(decoded.classes))
    if retyped:
        key = (key, tuple([tensor.dtype.v2 for tensor in outputs]))
    described: tuple[bytes, tuple[OutputTensor, ...]] | None = spec.responses.get(key)
    if described is None:
        tensors = tuple(OutputTensor(tensor.name, tensor.dtype.v2, array.shape)
                        for tensor, array in zip(outputs, arrays, strict=True))
        described = (encode_head(spec.name, str(version), tensors), tensors)
        if len(spec.responses) >= MAX_MEMO:
            spec.responses.clear()
        spec.responses[key] = described
    return described


def _write(target: RegionRange, array: np.ndarray, tensor: TensorSpec) -> None:
    """Copy an output into its shared memory range (one copy of the buffer the other transports
    send; BYTES with their length prefixes)."""
    data = memoryview(as_buffer(array, tensor.dtype)).cast("B")
    if data.nbytes > target.byte_size:
        raise InvalidInput(f"shared memory size specified with the request for output '{tensor.name}' "
                           f"({target.byte_size} bytes) should be at least {data.nbytes} bytes to hold the results")
    target.write(data)
