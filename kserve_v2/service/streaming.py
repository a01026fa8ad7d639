"""Every response of one request, as it comes (``InferenceService.model_stream``).

A model answered once gives one response, the service's ``run_version``'s. A request to a
decoupled model runs as a task of its own (decode, scheduler, backend: the one inference call), with a
``ResponseStream`` in its context (``kserve_v2.backend.decoupled``). Each response the model sends is
encoded as the wire codec's ``InferResponse`` carrying the request's ``id`` (only the requested
outputs, in the order asked for; each output's buffer is copied once, where the transport writes its
message) and yielded at once; the response statistics count it (Triton's ``response_stats``, by
response index). The stream ends with the response that carries the final flag; the execution may
still be running then (the instance is held until it returns). A caller that stops reading before
the final response cancels the request: the stream reports ``cancelled`` to the model, and its
execution is cancelled (``kserve_v2.backend.cancellation``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Protocol

import numpy as np

from kserve_v2.backend.decoupled import ResponseStream, Sent, Streamed
from kserve_v2.codec.messages import InferRequest, InferResponse, parameter
from kserve_v2.models.version import ModelVersion
from kserve_v2.observability.metrics import V2_API
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.request.decode import DecodedRequest
from kserve_v2.request.encode import encode_response

Answer = tuple[InferResponse, RequestReport]
# (model name, version) -> the version, held (``ModelLifecycle.acquire_version``)
Acquire = Callable[[str, str], ModelVersion]
# the service's ``_run``: (request, version, api, raw outputs, wire bytes, stream) -> answer
RunWith = Callable[[InferRequest, ModelVersion, str, bool, int | None, ResponseStream | None],
                   Coroutine[object, object, Answer]]
Run = Callable[[ResponseStream], Coroutine[object, object, Answer]]
# requests whose final response went out while their execution still runs
_finishing: set[asyncio.Task[Answer]] = set()


class AnswerOnce(Protocol):
    """(version, request) -> its one answer (``InferenceService.run_version``)."""

    def __call__(self, model: ModelVersion, request: InferRequest, *, wire_bytes: int | None = None
                 ) -> Awaitable[Answer]:
        ...


async def stream_request(request: InferRequest, wire_bytes: int | None, acquire: Acquire, answer_once: AnswerOnce,
                         run_with: RunWith) -> AsyncIterator[Streamed]:
    """Resolve and hold the request's version and yield its responses: ``answer_once``'s for a model
    answered once, else ``stream_responses``' (``run_with`` with a stream). The version is released
    once the request's execution is over. ``wire_bytes``: the size of the message the request was
    decoded from, if any (the memory budget's measure).

    Raises:
        As ``answer_once`` and ``stream_responses``; NotFound / Unavailable from ``acquire``.
    """
    model = acquire(request.model_name, request.model_version)
    if not model.decoupled:
        try:
            response, _ = await answer_once(model, request, wire_bytes=wire_bytes)
        finally:
            model.release()
        yield Streamed(response, None, True)
        return

    async def run(stream: ResponseStream) -> Answer:
        try:
            return await run_with(request, model, V2_API, True, wire_bytes, stream)
        finally:
            model.release()

    async for item in stream_responses(run, request, model):
        yield item


async def stream_responses(run: Run, request: InferRequest, model: ModelVersion) -> AsyncIterator[Streamed]:
    """Run ``request`` on the decoupled ``model`` (``run``: the service's call with a stream) and yield
    each response as it is sent (see the module docstring).

    Raises:
        Whatever the request raised before the model sent anything (its decoding, its scheduler, a
        backend that failed without responding); later failures are yielded as final errors.
    """
    loop = asyncio.get_running_loop()
    stream = ResponseStream(loop)
    task = loop.create_task(run(stream))
    task.add_done_callback(lambda _: stream.ended())
    index, last, final = 0, time.perf_counter_ns(), False
    try:
        while not final:
            sent = await stream.get()
            if sent is None:  # the execution returned (or failed)
                if task.cancelled():
                    return
                error = task.exception()
                if isinstance(error, Exception):
                    if not stream.sent:
                        raise error
                    final = True
                    yield Streamed(None, error, True)
                elif not stream.taken:  # a backend that answers once: its execution is the response
                    final = True
                    yield Streamed(task.result()[0], None, True)
                continue
            final = sent.final
            item, last = _streamed(request, model, sent, index, last), sent.sent_ns
            index += item.response is not None or item.error is not None
            yield item
    finally:
        if not final:  # the caller went away: the model sees the request cancelled (also from a thread it started)
            stream.cancel()
        if not task.done():
            if final:
                _finishing.add(task)  # answered: let the execution return and be counted
                task.add_done_callback(_finishing.discard)
            else:
                task.cancel()


def _streamed(request: InferRequest, model: ModelVersion, sent: Sent, index: int, last_ns: int) -> Streamed:
    """One sent response as the transports write it, counted in the version's response statistics."""
    stats = model.stats
    if sent.error is not None:
        stats.record_response(index, "fail", sent.sent_ns - last_ns, 0)
        return Streamed(None, sent.error, sent.final)
    if sent.outputs is None:
        stats.record_response(index, "empty_response", sent.sent_ns - last_ns, 0)
        return Streamed(None, None, sent.final)
    started = time.perf_counter_ns()
    try:
        response = encode(request, model, sent.outputs)
        if sent.parameters:
            response.parameters.update({key: parameter(value) for key, value in sent.parameters.items()})
    except Exception as err:  # noqa: BLE001 - an output the response cannot carry fails this response only
        stats.record_response(index, "fail", sent.sent_ns - last_ns, time.perf_counter_ns() - started)
        return Streamed(None, err, sent.final)
    stats.record_response(index, "success", sent.sent_ns - last_ns, time.perf_counter_ns() - started)
    return Streamed(response, None, sent.final)


def encode(request: InferRequest, model: ModelVersion, outputs: dict[str, np.ndarray]) -> InferResponse:
    """A response of ``request`` with the ``outputs`` the model sent that the request asked for (all
    outputs when it named none), in the order asked for, with the request's ``id``."""
    spec = model.spec
    wanted = [o.name for o in request.outputs] or [t.name for t in spec.outputs]
    names = [name for name in wanted if name in outputs]
    decoded = DecodedRequest({}, [spec.outputs_by_name[name] for name in names], 0, {}, {})
    response, _ = encode_response(request, spec, model.version, decoded, [outputs[name] for name in names])
    return response
