"""Raw binary inference requests (``Inference-Header-Content-Length: 0``; Triton's binary tensor data
extension, ``extension_binary_data.md`` "Raw Binary Request"): the whole body is the data of the
model's one input, and every output comes back binary.

The input's shape is deduced as Triton's core deduces it (``InferenceRequest::Normalize``): a batch
dimension of 1 when the model batches, then the configured dims, whose one variable dimension (if
any) takes what the body holds. A BYTES input must have exactly one element, and the whole body is
that element. Errors are Triton's texts, with the request-id prefix Triton puts on them (a raw
request has no id).
"""

from __future__ import annotations

import math

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.codec.messages import InferRequest, InputTensor, RequestHeader
from kserve_v2.protocol.datatypes import BY_CONFIG, BYTES
from kserve_v2.protocol.errors import InvalidInput
from transcoding.v2.json_tensors import HttpInfer

# Triton's ``LogRequest()`` prefix for a request without an id
NO_ID = "[request id: <id_unknown>] "
_MAX_ELEMENT = 2**32 - 1  # a BYTES element's 4-byte length prefix


def raw_binary_request(body: bytes, model: str, version: str, config: mc.ModelConfig) -> HttpInfer:
    """The request of a raw binary body for ``model``, from its configuration.

    Args:
        body: the HTTP body: the input's bytes (a BYTES input: the one element itself).
        config: the model version's completed configuration (its inputs and ``max_batch_size``).

    Raises:
        InvalidInput: a model with other than one input ("Raw request must only have 1 input ..."); an
            input with more than one variable dimension ("The shape of the raw input '<name>' can not be
            deduced ..."); a BYTES input of other than one element ("For BYTE datatype raw input '<name>',
            the model must have input shape [1]") -> INVALID_ARGUMENT / 400 (Triton's texts).
    """
    if len(config.input) != 1:
        raise InvalidInput(f"{NO_ID}Raw request must only have 1 input (found 1) to be deduced but got "
                           f"{len(config.input)} inputs in '{model}' model configuration")
    tensor = config.input[0]
    dtype = BY_CONFIG[mc.DataType.Name(tensor.data_type)]
    shape = [1] if config.max_batch_size else []
    variable = None
    for dim in tensor.dims:
        if dim == -1:
            if variable is not None:
                raise InvalidInput(f"{NO_ID}The shape of the raw input '{tensor.name}' can not be deduced because "
                                   "there are more than one variable-sized dimension")
            variable = len(shape)
        shape.append(dim)
    if dtype is BYTES:
        if variable is not None or math.prod(tensor.dims) != 1:
            raise InvalidInput(f"{NO_ID}For BYTE datatype raw input '{tensor.name}', the model must have input "
                               "shape [1]")
        if len(body) > _MAX_ELEMENT:
            raise InvalidInput(f"the raw input '{tensor.name}' is over {_MAX_ELEMENT} bytes, the most one BYTES "
                               "element can hold")
        data = len(body).to_bytes(4, "little") + body  # the one element, framed as BYTES travel
    else:
        if variable is not None:
            fixed = math.prod(d for d in tensor.dims if d != -1)
            shape[variable] = len(body) // max(fixed * dtype.itemsize, 1)
        data = body
    request = InferRequest(RequestHeader(model, version, inputs=[InputTensor(tensor.name, dtype.v2, shape)]),
                           raw_input_contents=[data])
    return HttpInfer(request, all_binary=True)
