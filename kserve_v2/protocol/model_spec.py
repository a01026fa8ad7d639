"""A model's tensor interface: as its backend declares it (``TensorDeclaration``), and as derived
once from its completed ModelConfig (``ModelSpec``).

``ModelSpec`` is what request validation and ModelMetadata read: names, datatypes, dims,
reshape and ``max_batch_size``. With ``max_batch_size > 0`` the first dim of every input and
output is the batch dim and is not listed in ``dims`` (Triton ``model_configuration.md``);
metadata then shows it as -1 (Triton ``tritonserver.cc``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.codec.messages import OutputTensor
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import DType
from kserve_v2.protocol.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class TensorDeclaration:
    """A model input or output as its backend declares it (an ``Executable``'s ``inputs`` and
    ``outputs``, from which ``config.pbtxt`` is auto-completed and checked): name, datatype, shape
    (-1 for symbolic dims), whether a request may omit it (inputs of backends with optional inputs,
    and overridable initializers), and whether it is an ONNX graph input that has an initializer
    (ONNX Runtime's overridable initializers: the initializer is used when a request omits it;
    Triton's onnxruntime backend serves them as optional inputs a configuration may declare, and
    does not auto-complete them)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    optional: bool = False
    overridable: bool = False


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One configured input or output.

    Attributes:
        name: tensor name, equal to the ONNX graph's name.
        dtype: row of the datatype table.
        dims: configured dims without the batch dim; -1 is a wildcard.
        reshape: the shape the model sees (without batch dim), or None when equal to ``dims``.
        optional: an input the request may omit.
        labels: an output's class labels by index, from its ``label_filename`` (the
            classification extension, ``kserve_v2.request.classification``); empty without one.
    """

    name: str
    dtype: DType
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool = False
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InputPlan:
    """How one raw entry becomes a feed: its array's dtype (None: BYTES), the shape the model
    sees (reshape applied), its element count and its byte size (numeric types)."""

    name: str
    numpy: np.dtype | None
    shape: tuple[int, ...]
    count: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """The outcome of validating one request signature (``kserve_v2.request.decode.decode_request``):
    what each raw entry becomes, the outputs, their names and the batch size."""

    inputs: tuple[InputPlan, ...]
    outputs: tuple[TensorSpec, ...]
    output_names: tuple[str, ...]
    batch_size: int


# entries of each of a model's memos (``ModelSpec.plans``, ``ModelSpec.responses``); emptied when full
MAX_MEMO = 256


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The validated tensor interface of one model (all versions share it)."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # the same tensors by name, built once (request validation looks them up per request)
    inputs_by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)
    outputs_by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)
    # request validation's memo (``kserve_v2.request.decode``): a request signature -> what such a
    # request decodes to, and (version, output names and shapes) -> the response's description
    # (model, version, outputs) encoded and as objects (``kserve_v2.request.encode``)
    plans: dict[Hashable, RequestPlan] = field(init=False, repr=False, compare=False)
    responses: dict[Hashable, tuple[bytes, tuple[OutputTensor, ...]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs_by_name", {t.name: t for t in self.inputs})
        object.__setattr__(self, "outputs_by_name", {t.name: t for t in self.outputs})
        object.__setattr__(self, "plans", {})
        object.__setattr__(self, "responses", {})

    @classmethod
    def from_config(cls, config: mc.ModelConfig, labels: Mapping[str, tuple[str, ...]] | None = None) -> ModelSpec:
        """Build the spec; the config must already be auto-completed and validated. ``labels``:
        output name -> its labels (read from each output's ``label_filename`` at load)."""
        inputs = tuple(_tensor(i, i.optional) for i in config.input)
        outputs = tuple(_tensor(o, labels=(labels or {}).get(o.name, ())) for o in config.output)
        return cls(config.name, config.max_batch_size, inputs, outputs)

    def api_shape(self, tensor: TensorSpec) -> list[int]:
        """Shape shown in ModelMetadata: ``dims`` with -1 prepended when batching."""
        return ([-1] if self.max_batch_size > 0 else []) + list(tensor.dims)

    def check_shape(self, tensor: TensorSpec, shape: list[int]) -> None:
        """Check a request input shape against the configured dims and batch limit.

        Raises:
            InvalidInput: wrong rank, a dim differing from a fixed configured dim, or a
                batch size above ``max_batch_size`` (Triton's texts) -> INVALID_ARGUMENT.
        """
        dims = shape
        if self.max_batch_size > 0:
            if shape and 0 <= shape[0] <= self.max_batch_size and tuple(shape[1:]) == tensor.dims:
                return  # the common case: a batch within the limit and exactly the configured dims
            if not shape:
                raise InvalidInput(
                    f"input '{tensor.name}' for model '{self.name}' must have a batch dimension"
                )
            if shape[0] > self.max_batch_size:
                raise InvalidInput(
                    f"inference request batch-size must be <= {self.max_batch_size} for '{self.name}'"
                )
            dims = shape[1:]
        if len(dims) != len(tensor.dims) or any(c != -1 and c != d for c, d in zip(tensor.dims, dims, strict=True)):
            raise InvalidInput(
                f"unexpected shape for input '{tensor.name}' for model '{self.name}'. "
                f"Expected {self.api_shape(tensor)}, got {shape}"
            )


def _tensor(tensor: mc.ModelInput | mc.ModelOutput, optional: bool = False, labels: tuple[str, ...] = ()) -> TensorSpec:
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return TensorSpec(tensor.name, _dtype(tensor.data_type), tuple(tensor.dims), reshape, optional, labels)


def _dtype(value: int) -> DType:
    return datatypes.BY_CONFIG[mc.DataType.Name(value)]
