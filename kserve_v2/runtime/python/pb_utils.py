"""``triton_python_backend_utils`` for python models run by this server (Triton's python backend
API, its "Python Backend" documentation): the module a ``model.py`` imports as ``pb_utils``.

``kserve_v2.runtime.python.backend`` registers it under that name. Requests, responses and tensors
are plain Python objects over numpy arrays (no stub process, no shared memory); a request a model
builds itself (business logic scripting) runs through the server's one inference call
(``kserve_v2.backend.local_calls``) with ``exec`` or ``async_exec``; a decoupled model answers through
``InferenceRequest.get_response_sender``. Names, signatures, constants and error texts are Triton's.
"""

from __future__ import annotations

import enum
import json
import logging
import queue
import struct
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

import numpy as np

from kserve_v2.backend import Parameter
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.backend.local_calls import LocalCalls
from kserve_v2.codec.messages import InferRequest, RequestedOutput, RequestHeader, parameter
from kserve_v2.runtime.python.config import ModelConfig, tensor_config
from kserve_v2.runtime.python.tensors import (TRITON_TYPES, InferenceResponse, MemoryType, Tensor, TritonError,
                                              TritonModelException, add_input, numpy_to_triton_type, response_of)

__all__ = ["InferenceResponse", "ModelConfig", "Tensor", "TritonError", "TritonModelException", "numpy_to_triton_type"]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU
TRITON_STRING_TO_NUMPY = {"TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
                          "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
                          "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
                          "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
                          "TYPE_STRING": np.object_}
_log = logging.getLogger("kserve_v2.python_models")


@dataclass(frozen=True, slots=True)
class PreferredMemory:
    """Where a model would like a BLS response's tensors (accepted; they are always in CPU memory)."""

    preferred_memory_type: MemoryType = MemoryType.TRITONSERVER_MEMORY_CPU
    preferred_device_id: int = 0


@dataclass(frozen=True, slots=True)
class Running:
    """What model code running now may use: its model's folder, the server's calls, and the models
    its requests' callers wait in (``kserve_v2.backend.local_calls``)."""

    model_dir: str
    calls: LocalCalls | None
    callers: tuple[str, ...]


# set by the backend around initialize, execute and finalize (threads a model starts see the last execute)
RUNNING: ContextVar[Running | None] = ContextVar("kserve_v2_python_running", default=None)
_last: list[Running] = []
# Triton's text for a BLS request outside execute (python_backend src/infer_request.cc)
BLS_OUTSIDE_EXECUTE = "BLS is only supported during the 'execute' function."


def enter(now: Running) -> Token[Running | None]:
    """Model code runs as ``now`` from here (``RUNNING``; reset it with the token). An execute's
    ``Running`` (one with the server's calls) is also what threads the model starts run as."""
    if now.calls is not None:
        _last[:] = [now]
    return RUNNING.set(now)


def running() -> Running:
    """The model code's ``Running`` (in a thread the model started: the last one set).

    Raises:
        TritonModelException: no python model has run yet.
    """
    current = RUNNING.get()
    if current is not None:
        return current
    if not _last:
        raise TritonModelException("no python model is executing: this call is only available inside a model")
    return _last[0]


class InferenceResponseSender:
    """Sends a request's responses (Triton's decoupled API), from execute or any thread or task after
    it. A model answered once may send its one response here instead of returning it (Triton's
    rules: a second response, or the final flag before any response, raises; a response sent wins
    over one execute returns). ``send`` hands them to ``deliver`` of the backend."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None], cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._cancelled = cancelled

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response`` (None: only the flags); ``flags`` ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``
        ends the request.

        Raises:
            TritonModelException: after the final flag ("Unable to send response. Response sender
                has been closed."); in a model answered once, a second response ("Unable to send
                response. Non-decoupled model cannot send more than one response.") or the final
                flag before any response ("... cannot send complete final before sending a response.").
        """
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"Expected an 'InferenceResponse' object, found type '{type(response).__name__}'.")
        self._deliver(response, bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL))

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled (its caller went away, e.g. a gRPC stream cancelled),
        also after execute returned."""
        return self._cancelled()


class InferenceRequest:
    """A request: one the model receives (in ``execute``), or one it sends to another model
    (business logic scripting: ``exec``, ``async_exec``).

    ``request_id`` and ``model_name`` may be ``str`` or UTF-8 ``bytes`` (as Triton's binding takes
    them, e.g. a model name read from a BYTES tensor), and ``requested_output_names`` either too.

    Raises:
        TritonModelException: a correlation id that is neither int nor str; parameters whose keys
            are not str or whose values are not bool, int or str.
    """

    def __init__(self, request_id: str | bytes = "", correlation_id: int | str = 0, inputs: Sequence[Tensor] = (),
                 requested_output_names: Sequence[str | bytes] = (), model_name: str | bytes = "",
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None, trace: Any = None,
                 parameters: dict[str, Parameter] | str | None = None) -> None:
        request_id, model_name = _text(request_id), _text(model_name)
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        given: dict[str, Parameter] = json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        for key, value in given.items():
            if not isinstance(key, str):
                raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
            if not isinstance(value, bool | int | str):
                raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
        self._id, self._correlation_id, self._flags, self._timeout = request_id, correlation_id, flags, timeout
        self._inputs = list(inputs)
        self._outputs = [_text(name) for name in requested_output_names]
        self._model_name, self._model_version = model_name, model_version
        self._parameters = given
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = lambda: False

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as JSON text."""
        return json.dumps(self._parameters)

    def trace(self) -> None:
        return None

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender of this request's responses.

        Raises:
            TritonModelException: a request the model built itself has no sender.
        """
        if self._sender is None:
            raise TritonModelException("only a request the model received has a response sender")
        return self._sender

    def is_cancelled(self) -> bool:
        """Whether the request's caller went away."""
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        """Triton's request rescheduling, which this server does not do.

        Raises:
            TritonModelException: ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``.
        """
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not "
                                       "supported by this server")

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: its response (an error is the response's, not
        raised), or with ``decoupled`` an iterator of its responses, the last one final (empty when
        the model sent the final flag alone)."""
        calls, message, callers = self._sending()
        if decoupled:
            return _ResponseIterator(calls, message, callers)
        try:
            return response_of(calls.infer(message, callers).result())
        except Exception as err:  # noqa: BLE001 - Triton answers a failed BLS request with an error response
            return InferenceResponse(error=TritonError.of(err))

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for an ``async def execute``: awaits the response (or, with ``decoupled``, the
        iterator of the responses) without blocking the model's other coroutines."""
        import asyncio

        calls, message, callers = self._sending()
        if decoupled:
            return _ResponseIterator(calls, message, callers)
        try:
            return response_of(await asyncio.wrap_future(calls.infer(message, callers)))
        except Exception as err:  # noqa: BLE001 - as exec
            return InferenceResponse(error=TritonError.of(err))

    def _sending(self) -> tuple[LocalCalls, InferRequest, tuple[str, ...]]:
        """What a BLS send needs: the server's local calls, this request as a V2 request, and the
        models already on the calling chain (the depth guard's input).

        Raises:
            TritonModelException: in ``initialize``, ``auto_complete_config`` or ``finalize``, or in a
                thread before the model executed a request (Triton's text: "BLS is only supported
                during the 'execute' function."). Threads the model started may send after execute
                returned, as in Triton.
        """
        now = RUNNING.get()
        if now is None:  # a thread the model started: it runs as the last execute
            now = _last[0] if _last else None
        if now is None or now.calls is None:
            raise TritonModelException(BLS_OUTSIDE_EXECUTE)
        return now.calls, self._message(), now.callers

    def _message(self) -> InferRequest:
        """This request as the V2 request it is sent as: its correlation id and flags become the
        ``sequence_*`` parameters."""
        parameters = {key: parameter(value) for key, value in self._parameters.items()}
        if self._correlation_id:
            parameters["sequence_id"] = parameter(self._correlation_id)
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = parameter(True)
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = parameter(True)
        version = str(self._model_version) if self._model_version > 0 else ""
        message = InferRequest(RequestHeader(self._model_name, version, parameters, [],
                                             [RequestedOutput(name) for name in self._outputs]), self._id)
        for tensor in self._inputs:
            add_input(message, tensor)
        return message


def _text(value: str | bytes) -> str:
    """A name given as ``str`` or UTF-8 ``bytes`` (pybind11's ``std::string`` takes both), as ``str``."""
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else value


def received(request_id: str, correlation_id: int | str, flags: int, parameters: dict[str, Parameter],
             inputs: list[Tensor], output_names: Sequence[str], sender: InferenceResponseSender,
             cancelled: Callable[[], bool]) -> InferenceRequest:
    """A request as the model receives it in ``execute`` (the backend builds it): with its response
    sender and a view of whether its caller went away."""
    request = InferenceRequest(request_id, correlation_id, inputs, output_names, flags=flags)
    request._parameters, request._sender, request._cancelled = parameters, sender, cancelled
    return request


class _ResponseIterator:
    """The responses of a BLS request to a decoupled model, as they come (Triton's ``ResponseIterator``)."""

    def __init__(self, calls: LocalCalls, message: InferRequest, callers: tuple[str, ...]) -> None:
        self._items: queue.SimpleQueue[Streamed] = queue.SimpleQueue()
        self._done = False
        calls.stream(message, callers, self._items.put)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        item = self._items.get()
        self._done = item.final
        if item.error is not None:
            return InferenceResponse(error=TritonError.of(item.error))
        return response_of(item.response) if item.response is not None else InferenceResponse()


class Logger:
    """Log lines from model code, in the server's log (logger ``kserve_v2.python_models``)."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: Logger.LogLevel = LogLevel.INFO) -> None:
        _log.log((logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)[int(level)], "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


def get_model_dir() -> str:
    """The folder of the version whose code runs (where its ``model.py`` is)."""
    return running().model_dir


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return tensor_config(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return TRITON_TYPES[data_type] if 0 < data_type < len(TRITON_TYPES) else None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()]:
    """BYTES elements framed with their 4-byte little-endian lengths, in row-major order."""
    if input_tensor.size == 0:
        return ()
    parts = []
    for item in input_tensor.reshape(-1).tolist():
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The elements of framed BYTES, as a 1-D object array of ``bytes``."""
    items, offset = [], 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        items.append(bytes(encoded_tensor[offset + 4 : offset + 4 + length]))
        offset += 4 + length
    return np.array(items, dtype=np.object_)


def _not_here(what: str) -> Callable[..., Any]:
    def refuse(*_: Any, **__: Any) -> Any:
        raise TritonModelException(f"{what} is not supported by this server")

    return refuse


load_model = _not_here("pb_utils.load_model (model control from a python model)")
unload_model = _not_here("pb_utils.unload_model (model control from a python model)")
is_model_ready = _not_here("pb_utils.is_model_ready")
MetricFamily = _not_here("pb_utils.MetricFamily (custom metrics)")
