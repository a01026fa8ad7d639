"""Tensors, responses and errors of Triton's python backend API (``triton_python_backend_utils``,
gathered in ``kserve_v2.runtime.python.pb_utils``), and their conversion to and from the V2 messages
a business logic scripting request travels in.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np

from kserve_v2.codec.messages import InferRequest, InferResponse, InputTensor
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import BYTES, DType
from kserve_v2.protocol.errors import (AlreadyExists, Cancelled, ErrorCode, InternalError, InvalidInput, NotFound,
                                       ServerError, Unavailable, Unknown, Unsupported)
from kserve_v2.protocol.tensors import from_raw, to_raw

# Triton's TRITONSERVER_DataType numbers are the positions in this tuple (triton_to_numpy_type)
TRITON_TYPES = (None, np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
                np.float16, np.float32, np.float64, np.object_)


class TritonModelException(Exception):
    """What model code raises to fail its requests (Triton's ``pb_utils.TritonModelException``)."""


class TritonError:
    """A response's error: a message and one of Triton's error codes (``TritonError.INTERNAL``, ...; the
    numbers of ``TRITONSERVER_Error_Code``).

    A client sees each code as Triton's server reports it (``src/grpc/grpc_utils.cc`` and
    ``HttpCodeFromError`` in triton-inference-server/server): UNKNOWN -> UNKNOWN / 400, INTERNAL ->
    INTERNAL / 500, NOT_FOUND -> NOT_FOUND / 404, INVALID_ARG -> INVALID_ARGUMENT / 400, UNAVAILABLE ->
    UNAVAILABLE / 503, UNSUPPORTED -> UNIMPLEMENTED / 501, ALREADY_EXISTS -> ALREADY_EXISTS / 400,
    CANCELLED -> CANCELLED / 499 (Triton: 400); a code outside these is UNKNOWN, as in Triton.
    """

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)
    # the server's error class of each code
    _CLASSES: tuple[type[ServerError], ...] = (Unknown, InternalError, NotFound, InvalidInput, Unavailable,
                                               Unsupported, AlreadyExists, Cancelled)

    def __init__(self, message: str, code: int = 1) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def as_server_error(self) -> ServerError:
        """The server's error carrying this message, with the status of this code."""
        return self._CLASSES[self._code if 0 <= self._code < len(self._CLASSES) else 0](self._message)

    @classmethod
    def of(cls, err: BaseException) -> TritonError:
        """The error a failed request gives a model that sent it."""
        code = err.code if isinstance(err, ServerError) else ErrorCode.INTERNAL
        codes = {ErrorCode.UNKNOWN: cls.UNKNOWN, ErrorCode.NOT_FOUND: cls.NOT_FOUND, ErrorCode.INVALID_ARGUMENT: cls.INVALID_ARG,
                 ErrorCode.UNAVAILABLE: cls.UNAVAILABLE, ErrorCode.UNIMPLEMENTED: cls.UNSUPPORTED,
                 ErrorCode.ALREADY_EXISTS: cls.ALREADY_EXISTS, ErrorCode.CANCELLED: cls.CANCELLED}
        return cls(str(err) if isinstance(err, ServerError) else f"{type(err).__name__}: {err}",
                   codes.get(code, cls.INTERNAL))


def binding_type_error(function: str, signature: str, given: Sequence[Any]) -> TypeError:
    """The ``TypeError`` Triton's pb_utils raise for arguments of a wrong type: its classes and functions
    are pybind11 bindings, and this is pybind11's text ("incompatible constructor arguments" for
    ``__init__``), with ``signature`` the binding's one overload and ``given`` the values passed."""
    kind = "constructor" if function == "__init__" else "function"
    return TypeError(f"{function}(): incompatible {kind} arguments. The following argument types are supported:\n"
                     f"    1. {signature}\n\nInvoked with: {', '.join(map(repr, given))}")


def text(value: str | bytes | bytearray) -> str:
    """A name given as ``str`` or UTF-8 ``bytes`` (pybind11's ``std::string`` takes both), as ``str``."""
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else value


def is_text(value: object) -> TypeGuard[str | bytes | bytearray]:
    """Whether pybind11's ``std::string`` takes ``value`` (``str`` or ``bytes``)."""
    return isinstance(value, str | bytes | bytearray)


def as_sent(array: np.ndarray) -> np.ndarray:
    """An object array as Triton's python backend sends it as BYTES (``serialize_byte_tensor`` of its
    ``triton_python_backend_utils``): an element that is neither ``bytes`` nor ``str`` becomes
    ``str(element)`` in UTF-8 (``np.asarray([1, True], dtype=object)`` is sent as ``b"1"``, ``b"True"``);
    an array of ``bytes`` and ``str`` only is itself."""
    items = array.reshape(-1).tolist()
    if all(issubclass(kind, bytes | str) for kind in set(map(type, items))):
        return array
    sent = np.empty(array.shape, dtype=np.object_)
    sent.reshape(-1)[:] = [item if isinstance(item, bytes | str) else str(item).encode("utf-8") for item in items]
    return sent


def dtype_of(array: np.ndarray, name: str) -> DType:
    """The V2 datatype of a tensor's array (``bytes``, ``str`` and object arrays are BYTES).

    Raises:
        TritonModelException: a numpy type the V2 protocol cannot carry.
    """
    if array.dtype.kind in "OSU":
        return BYTES
    found = datatypes.BY_NUMPY.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
    if found is None:
        raise TritonModelException(f"tensor '{name}' has numpy type {array.dtype}, which no V2 datatype carries")
    return found


class MemoryType(enum.IntEnum):
    """Where a tensor's memory is (here always CPU)."""

    TRITONSERVER_MEMORY_CPU = 0
    TRITONSERVER_MEMORY_GPU = 2


class _Capsule:
    """A bare DLPack capsule in the protocol ``np.from_dlpack`` reads (a CPU tensor)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return 1, 0


class Tensor:
    """A named tensor over a numpy array (BYTES: an array of ``bytes``, ``str`` or, in an object array,
    any object, sent as ``str(object)``: ``as_sent``, which ``as_numpy`` then gives), in CPU memory.

    Raises:
        TypeError: a name that is not ``str`` (or ``bytes``) or data that is not a numpy array
            (pybind11's text, as Triton's binding); the request then fails with INTERNAL / 500.
        TritonModelException: an empty name (Triton's "Tensor name cannot be an empty string.").
    """

    def __init__(self, name: str, data: np.ndarray) -> None:
        if not is_text(name) or not isinstance(data, np.ndarray):
            raise binding_type_error("__init__", "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)",
                                     (name, data))
        name = text(name)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        self._name = name
        array = data if data.flags.c_contiguous else np.ascontiguousarray(data)
        self._array = as_sent(array) if array.dtype == np.object_ else array
        self.dtype = dtype_of(self._array, name)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._array.dtype) or 0

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """The array as a DLPack capsule (numpy's; not for BYTES)."""
        if self.dtype is BYTES:
            raise TritonModelException("DLPack does not have support for string tensors.")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return 1, 0  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A tensor from an object with ``__dlpack__`` (or a DLPack capsule) in CPU memory."""
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        source = _Capsule(tensor) if type(tensor).__name__ == "PyCapsule" else tensor
        if not hasattr(source, "__dlpack__") or not hasattr(source, "__dlpack_device__"):
            raise TritonModelException("Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                                       "`__dlpack__` and `__dlpack_device__` attributes")
        try:
            return Tensor(name, np.from_dlpack(source))
        except (BufferError, RuntimeError, TypeError) as err:
            raise TritonModelException(f"tensor '{name}' cannot be read from DLPack here (CPU memory only): {err}") from None


class InferenceResponse:
    """A response: output tensors, or an error, and its parameters (Triton's python backend README,
    "Inference Response Parameters": a dict of str -> bool, int or str, which reaches the client as the
    response's ``parameters``, in ``generate`` as keys of the answer).

    Raises:
        TritonModelException: an output tensor that is None ("Output tensor for inference response
            should not be empty."); ``parameters`` that is not a dict, or has a key that is not str or a
            value that is not bool, int or str (Triton's texts); the request then fails with INTERNAL / 500.
        TypeError: ``output_tensors`` that is not a list of tensors (None included) or an ``error`` that
            is not a ``TritonError`` (pybind11's text, as Triton's binding).
    """

    def __init__(self, output_tensors: Sequence[Tensor] = (), error: TritonError | None = None,
                 parameters: dict[str, bool | int | str] | None = None) -> None:
        if not tensor_list(output_tensors) or not (error is None or isinstance(error, TritonError)):
            raise binding_type_error("__init__", "c_python_backend_utils.InferenceResponse(output_tensors: "
                                     "List[c_python_backend_utils.Tensor] = [], error: c_python_backend_utils."
                                     "TritonError = None)", (output_tensors, error))
        if any(tensor is None for tensor in output_tensors):
            raise TritonModelException("Output tensor for inference response should not be empty.")
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = checked_parameters(parameters)

    def parameters(self) -> str:
        """The response's parameters as JSON text ("{}" when it has none)."""
        return json.dumps(self._parameters)

    def parameter_values(self) -> dict[str, bool | int | str]:
        """The response's parameters (the server reads them to answer the request)."""
        return self._parameters

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def tensor_list(tensors: object) -> bool:
    """Whether pybind11 takes ``tensors`` as a list of Triton's tensors: a sequence (not text) whose
    items are tensors or None (None makes an empty pointer, which Triton's constructors refuse)."""
    return (isinstance(tensors, Sequence) and not is_text(tensors)
            and all(tensor is None or isinstance(tensor, Tensor) for tensor in tensors))


def checked_parameters(parameters: Any) -> dict[str, bool | int | str]:
    """``parameters`` of a response or request as Triton's binding checks them (None: none).

    Raises:
        TritonModelException: not a dict; a key not str; a value not bool, int or str (Triton's texts).
    """
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return dict(parameters)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """Triton's data type number of a numpy type (13: BYTES), or None."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return 13
    return next((i for i, known in enumerate(TRITON_TYPES) if known is not None and dtype == np.dtype(known)), None)


def add_input(request: InferRequest, tensor: Tensor) -> None:
    """Add ``tensor`` to a request, its data copied into ``raw_input_contents`` (model code may change
    its array once the request is sent: Triton's python backend copies a BLS request's inputs too)."""
    array = tensor.as_numpy()
    request.inputs.append(InputTensor(tensor.name(), tensor.dtype.v2, array.shape))
    request.raw_input_contents.append(to_raw(array, tensor.dtype))


def response_of(response: InferResponse) -> InferenceResponse:
    """The response a model reads from a response (outputs as read-only numpy arrays over its buffers)."""
    outputs = []
    for described, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        dtype = datatypes.BY_V2[described.datatype]
        data = raw.toreadonly() if isinstance(raw, memoryview) else raw  # a view of the answering model's array
        outputs.append(Tensor(described.name, from_raw(data, dtype, list(described.shape), f"output '{described.name}'")))
    parameters = {key: value.value for key, value in response.parameters.items() if isinstance(value.value, bool | int | str)}
    return InferenceResponse(outputs, parameters=parameters)
