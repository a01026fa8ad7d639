"""Decoupled models: zero, one or many responses to one request (Triton's ``model_transaction_policy
{ decoupled: true }``, its "Decoupled Backends and Models" page).

A request to a decoupled model carries a ``ResponseStream`` in its ``RequestContext``
(``kserve_v2.backend``). The backend takes the stream (``take``) and sends each response to it, from
any thread, while and after its execution runs; the last one carries the final flag (Triton's
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``), alone or with a response. A backend that does not take
the stream answers with its execution, as one final response. ``InferenceService.model_stream``
reads the stream on the event loop and yields each response as a ``Streamed``, which
``ModelStreamInfer``, the ``generate`` routes and business logic scripting write as their protocols
want them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import numpy as np

from kserve_v2.codec.messages import InferResponse
from kserve_v2.protocol.errors import ServerError, Unavailable

# a response parameter's value (``kserve_v2.backend.Parameter``, which imports this module)
Parameter = bool | int | float | str
CLOSED = "Unable to send response. Response sender has been closed."  # Triton's python backend text


@dataclass(frozen=True, slots=True)
class Sent:
    """One response as a decoupled model sends it.

    Attributes:
        outputs: output name -> array; None for a final flag sent without a response.
        error: the response's error, or None.
        final: whether it is the request's last response.
        sent_ns: when it was sent (``time.perf_counter_ns``).
        parameters: the response's own parameters (a python model's ``InferenceResponse(parameters=)``), or None.
    """

    outputs: dict[str, np.ndarray] | None
    error: ServerError | None
    final: bool
    sent_ns: int
    parameters: dict[str, Parameter] | None = None


@dataclass(frozen=True, slots=True)
class Streamed:
    """One response of a request on a stream, as the transports write it.

    Attributes:
        response: the response (id, model, version, outputs); None for a final flag without one.
        error: the response's error (then ``response`` is None), or None.
        final: whether it is the request's last response.
    """

    response: InferResponse | None
    error: Exception | None
    final: bool


class ResponseStream:
    """The responses of one request to a decoupled model: sent from any thread, read in order on
    the event loop that created the stream.

    Attributes:
        taken: the backend sends the responses itself (otherwise its execution is the one response).
        sent: responses sent so far (final flags without a response not counted).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Sent | None] = asyncio.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._cancelled = False
        self.taken = False
        self.sent = 0

    def take(self) -> None:
        """The backend sends this request's responses itself (``send``), with a final flag at the end."""
        self.taken = True

    @property
    def closed(self) -> bool:
        """Whether the final flag was sent: no response may follow."""
        return self._closed

    @property
    def cancelled(self) -> bool:
        """Whether the request was cancelled: its caller went away; further responses are dropped."""
        return self._cancelled

    def send(self, outputs: dict[str, np.ndarray] | None, error: ServerError | None = None, final: bool = False,
             parameters: dict[str, Parameter] | None = None) -> None:
        """Send one response (with its own ``parameters``, if any), or (``outputs`` and ``error`` None)
        only the final flag; any thread. After the request was cancelled, what is sent is dropped.

        Raises:
            Unavailable: the final flag was sent already (Triton's text: "Unable to send response.
                Response sender has been closed.").
        """
        with self._lock:
            if self._cancelled:
                return
            if self._closed:
                raise Unavailable(CLOSED)
            self._closed = final
            if outputs is not None or error is not None:
                self.sent += 1
        if self._loop.is_closed():
            return
        item = Sent(outputs, error, final, time.perf_counter_ns(), parameters)
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop closed meanwhile: the server is gone, and so is the reader
            pass

    def cancel(self) -> None:
        """The caller went away: ``cancelled`` turns true and nothing more is delivered (event loop)."""
        with self._lock:
            self._cancelled = True

    def ended(self) -> None:
        """The execution that the responses belong to has returned (event loop): wakes the reader."""
        self._queue.put_nowait(None)

    async def get(self) -> Sent | None:
        """The next response in the order sent, or None once per ``ended`` (event loop)."""
        return await self._queue.get()
