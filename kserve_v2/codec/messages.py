"""The V2 inference messages as plain Python objects: what the codec decodes and encodes.

Field names are those of Triton's ``grpc_service.proto`` (``ModelInferRequest``,
``ModelInferResponse``), so code reads ``request.inputs[i].shape`` as it would read the generated
classes. Differences from the generated classes, which are what the codec is for:

- ``raw_input_contents`` and ``raw_output_contents`` hold buffers (``memoryview`` slices of the
  received message, views of output arrays), never copies;
- a parameter is an ``InferParameter``: the ``parameter_choice`` field set (None when none is) and
  its value;
- an input's ``contents`` is None when the message has no ``contents`` field (``HasField`` false),
  else a ``TensorContents`` listing its non-empty fields in field-number order.

Requests decoded from the wire share their description (everything but ``id`` and the raw
contents) with every other request whose description has the same bytes: treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

Buffer = bytes | memoryview
Value = bool | int | float | str

# InferParameter's oneof, by field number
PARAMETER_CHOICES = ("bool_param", "int64_param", "string_param", "double_param", "uint64_param")
# InferTensorContents' fields, by field number
CONTENTS_FIELDS = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                   "fp32_contents", "fp64_contents", "bytes_contents")
_INT64_MAX = 2**63 - 1


class InferParameter(NamedTuple):
    """One ``InferParameter``: the oneof member set (``"int64_param"``, ...; None when none is) and its value."""

    choice: str | None
    value: Value


UNSET = InferParameter(None, "")


def parameter(value: Value) -> InferParameter:
    """A parameter holding ``value``: bool, int64 (uint64 above int64's range), double or string."""
    if isinstance(value, bool):
        return InferParameter("bool_param", value)
    if isinstance(value, int):
        return InferParameter("uint64_param" if value > _INT64_MAX else "int64_param", value)
    if isinstance(value, float):
        return InferParameter("double_param", value)
    return InferParameter("string_param", value)


class TensorContents:
    """A present ``InferTensorContents``: ``fields`` maps each non-empty field, in field-number order,
    to its values (a numpy array for numbers: bool, int32, int64, uint32, uint64, float32, float64;
    a list of ``bytes`` for ``bytes_contents``)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, np.ndarray | list[bytes]]) -> None:
        self.fields = fields


class InputTensor:
    """``ModelInferRequest.InferInputTensor``; ``shape`` is a list of int64 dims as sent."""

    __slots__ = ("name", "datatype", "shape", "parameters", "contents")

    def __init__(self, name: str = "", datatype: str = "", shape: Sequence[int] = (),
                 parameters: dict[str, InferParameter] | None = None, contents: TensorContents | None = None) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = list(shape)
        self.parameters = parameters if parameters is not None else {}
        self.contents = contents


class RequestedOutput:
    """``ModelInferRequest.InferRequestedOutputTensor``."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str = "", parameters: dict[str, InferParameter] | None = None) -> None:
        self.name = name
        self.parameters = parameters if parameters is not None else {}


class RequestHeader:
    """What a request says besides its ``id`` and raw contents; ``memo`` is free for validation to
    keep what it derives from the header (requests decoded from the same bytes share one header)."""

    __slots__ = ("model_name", "model_version", "parameters", "inputs", "outputs", "memo")

    def __init__(self, model_name: str = "", model_version: str = "", parameters: dict[str, InferParameter] | None = None,
                 inputs: list[InputTensor] | None = None, outputs: list[RequestedOutput] | None = None) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.parameters = parameters if parameters is not None else {}
        self.inputs = inputs if inputs is not None else []
        self.outputs = outputs if outputs is not None else []
        self.memo: Hashable | None = None


class InferRequest:
    """``ModelInferRequest``: its header's fields, its ``id`` and ``raw_input_contents`` (buffers)."""

    __slots__ = ("header", "id", "model_name", "model_version", "parameters", "inputs", "outputs",
                 "raw_input_contents")

    def __init__(self, header: RequestHeader, id: str = "", raw_input_contents: list[Buffer] | None = None) -> None:
        self.header = header
        self.id = id
        self.model_name = header.model_name
        self.model_version = header.model_version
        self.parameters = header.parameters
        self.inputs = header.inputs
        self.outputs = header.outputs
        self.raw_input_contents = raw_input_contents if raw_input_contents is not None else []


class OutputTensor:
    """``ModelInferResponse.InferOutputTensor`` (responses carry data in raw contents only)."""

    __slots__ = ("name", "datatype", "shape", "parameters")

    def __init__(self, name: str, datatype: str, shape: Sequence[int],
                 parameters: dict[str, InferParameter] | None = None) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = list(shape)
        self.parameters = parameters if parameters is not None else {}


class InferResponse:
    """``ModelInferResponse``. ``head``: the encoded ``model_name``, ``model_version`` and ``outputs``
    when they came from a memo (the encoder then writes those bytes instead of the fields)."""

    __slots__ = ("model_name", "model_version", "id", "parameters", "outputs", "raw_output_contents", "head")

    def __init__(self, model_name: str, model_version: str, id: str = "",
                 parameters: dict[str, InferParameter] | None = None, outputs: Sequence[OutputTensor] = (),
                 raw_output_contents: list[Buffer] | None = None, head: bytes | None = None) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.parameters = parameters if parameters is not None else {}
        self.outputs = outputs
        self.raw_output_contents = raw_output_contents if raw_output_contents is not None else []
        self.head = head
