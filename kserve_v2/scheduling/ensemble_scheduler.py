"""Triton's ensemble scheduler (``ensemble_scheduler.cc``): an ensemble version's ``Scheduler``.

A request runs only the steps its requested outputs need (``ensemble.needed_steps``), each as
soon as its inputs are ready, steps whose inputs are ready concurrently. Each step is a new request
(carrying the ensemble request's parameters, asking for every output the step maps) sent through
the server's one inference call as business logic scripting sends its requests
(``InferenceService.model_infer_reported``, ``kserve_v2.backend.local_calls``), with the wire codec's
request and response objects: the tensors pass as read-only views of the arrays that made them,
never serialized. So the step model's scheduler (its dynamic batcher and queue delay), statistics,
metrics and tracing see it like any request; a tensor passed between a model without batching and one with batching
gains or loses a batch dim of 1 (``ensemble.reshape_between``). The response carries
``sequence_id``, ``sequence_start`` and ``sequence_end`` from the request. An optional ensemble
input that the request omits, and a step output that its model did not produce, are empty: a step
is sent without them (its model then decides whether that input may be left out), as Triton's
scheduler does. An ensemble has no backend and no instances: nothing runs here but the steps' own
requests.

A decoupled step (Triton's python_backend ``decoupled_models.md``, "Decoupled models in ensembles")
is sent through the server's stream call (``InferenceService.model_stream``) once the other steps
that can run have; each of its responses is a set of tensors of its own, with which the steps after
it run (again per response of a decoupled step further on), and each set that completes the
requested outputs is one response of the ensemble, decoupled itself, sent to the request's
``ResponseStream`` as it is made (an output not produced is left out, as Triton leaves it out). The
responses of one step are taken in the order sent, each run to its end before the next (they wait
in the step's stream meanwhile, the step's model is not held up). A response goes with the final
flag when every decoupled step has sent its own final flag by then, else the flag follows alone
(as Triton's ``FinishEnsemble`` does, by timing); an error response of a step (or a step's failure)
ends the ensemble's request with that error, after the responses sent so far, and cancels the
decoupled steps still answering. A request cancelled by its caller cancels them too: their models
see ``is_cancelled()``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, Execution, Parameter, RequestContext, ResponseStream
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.codec.messages import (Buffer, InferParameter, InferRequest, InferResponse, InputTensor, RequestedOutput,
                                      RequestHeader, parameter)
from kserve_v2.protocol.model_spec import MAX_MEMO
from kserve_v2.protocol.tensors import as_buffer, from_raw
from kserve_v2.scheduling.base import Feeds, Outcome
from kserve_v2.scheduling.ensemble import Step, StepRunner, StepStreamer, decoupled, needed_steps, reshape_between

# ensemble tensor -> (its array, None when empty; the batch size of the request that made it)
Tensors = dict[str, tuple[np.ndarray | None, int]]


class EnsembleScheduler:
    """Runs an ensemble's requests as requests to its steps' models (see the module docstring).

    Args:
        config: the ensemble's completed configuration (its batching and output dims).
        steps: the validated steps (``ensemble.plan``).
        runner: the server's inference call the steps go through.
        streamer: the server's stream call the decoupled steps go through; None: there is none (a
            decoupled step is then refused by ``runner`` as any request answered once to it is).
    """

    def __init__(self, config: mc.ModelConfig, steps: tuple[Step, ...], runner: StepRunner,
                 streamer: StepStreamer | None = None) -> None:
        self._name = config.name
        self._streamer = streamer
        self._decoupled = streamer is not None and decoupled(steps)
        self._batching = config.max_batch_size > 0
        self._output_dims = {o.name: tuple(o.dims) for o in config.output}
        self._optional = tuple(i.name for i in config.input if i.optional)
        self._steps = steps
        self._runner = runner
        # requested outputs -> the steps they need (at most MAX_MEMO entries, emptied when full)
        self._needed: dict[frozenset[str], tuple[Step, ...]] = {}

    async def submit(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                     batch_size: int, context: RequestContext = NO_CONTEXT) -> Outcome:
        """Run the steps the requested outputs need, each as its inputs become ready:
        (execution, 0 queue ns, elapsed ns), as ``Scheduler.submit``. The steps are requests of
        their own, sent in this request's task: they have its callers (``kserve_v2.backend.local_calls``).

        A decoupled ensemble (one with a decoupled step) sends its responses to ``context.responses``
        (see the module docstring); its execution then has no outputs. A requested output that its
        step's model did not produce is left out of the response (``Execution.names``), as Triton's
        ensemble scheduler leaves it out.

        Raises:
            Whatever a step's inference call raises (its model's error, with its status): a step
            model's required input left empty is that model's INVALID_ARGUMENT. A decoupled step's
            error response, with its status.
        """
        started = time.perf_counter_ns()
        # Triton's request batch size: 0 for an ensemble without batching
        batch = batch_size if self._batching else 0
        tensors: Tensors = {name: (array, batch) for name, array in feeds.items()}
        for name in self._optional:
            tensors.setdefault(name, (None, batch))  # omitted: empty
        key = frozenset(output_names)
        pending: Sequence[Step] | None = self._needed.get(key)
        if pending is None:
            if len(self._needed) >= MAX_MEMO:
                self._needed.clear()
            pending = self._needed[key] = needed_steps(self._steps, output_names)
        response = {"sequence_id": parameters.get("sequence_id", 0),  # Triton's ensemble answers with these
                    "sequence_start": bool(parameters.get("sequence_start", False)),
                    "sequence_end": bool(parameters.get("sequence_end", False))}
        step_parameters = {key: parameter(value) for key, value in parameters.items()}  # shared by its steps
        if self._decoupled and context.responses is not None:
            await self._stream(tensors, pending, output_names, step_parameters, batch, context.responses, response)
            return Execution([], parameters=response), 0, time.perf_counter_ns() - started
        while pending:
            ready = [s for s in pending if all(b.ensemble_tensor in tensors for b in s.inputs)]
            # every step input is an ensemble input or a step's output (ensemble.check_config), and
            # every ensemble input and step output is in ``tensors``, empty or not, once its step ran
            assert ready, f"ensemble '{self._name}': no step can run"
            await self._run_steps(ready, tensors, step_parameters)
            pending = _without(pending, ready)
        outputs, made = [], []
        for name in output_names:
            array, produced_by = tensors[name]
            if array is not None:  # not produced by its step's model: left out of the response (Triton)
                made.append(name)
                outputs.append(array.reshape(reshape_between(self._output_dims[name], batch != 0, produced_by,
                                                             array.shape)))
        return (Execution(outputs, parameters=response, names=None if len(made) == len(output_names) else made), 0,
                time.perf_counter_ns() - started)

    async def _stream(self, tensors: Tensors, pending: Sequence[Step], output_names: Sequence[str],
                      parameters: dict[str, InferParameter], batch: int, responses: ResponseStream,
                      response_parameters: dict[str, Parameter]) -> None:
        """Run a decoupled ensemble's request, sending each response to ``responses`` as it is made and
        the final flag last (alone when no response could carry it)."""
        responses.take()
        answering: list[_Answers] = []  # the decoupled steps answering for the tensors being made
        final = False
        async with aclosing(self._flow(tensors, pending, parameters, answering)) as results:
            async for made in results:
                outputs = {}
                for name in output_names:
                    array, produced_by = made[name]
                    if array is not None:  # not produced: left out of this response (Triton)
                        outputs[name] = array.reshape(reshape_between(self._output_dims[name], batch != 0,
                                                                      produced_by, array.shape))
                final = all(answers.exhausted for answers in answering)
                responses.send(outputs, final=final, parameters=response_parameters)
        if not final:
            responses.send(None, final=True)

    async def _flow(self, tensors: Tensors, pending: Sequence[Step], parameters: dict[str, InferParameter],
                    answering: list[_Answers]) -> AsyncGenerator[Tensors, None]:
        """The ensemble tensors of each response: run the steps that can run (all but the decoupled
        ones) until only a decoupled step can, then the steps left once per response of that step;
        ``answering``: the decoupled steps whose responses the tensors being made come from."""
        pending = list(pending)
        while pending:
            ready = [s for s in pending if all(b.ensemble_tensor in tensors for b in s.inputs)]
            assert ready, f"ensemble '{self._name}': no step can run"
            once = [s for s in ready if not s.decoupled]
            if once:
                await self._run_steps(once, tensors, parameters)
                pending = _without(pending, once)
                continue
            step, rest = ready[0], _without(pending, ready[:1])
            assert self._streamer is not None
            request, batch = self._request(step, tensors, parameters)
            answers = _Answers(self._streamer(request))
            answering.append(answers)
            try:
                while (sent := await answers.next()) is not None:
                    if sent.error is not None:
                        raise sent.error
                    assert sent.response is not None
                    made = {**tensors, **self._produced(step, sent.response, batch)}
                    async with aclosing(self._flow(made, rest, parameters, answering)) as results:
                        async for result in results:
                            yield result
            finally:
                answering.remove(answers)
                answers.cancel()
            return
        yield tensors

    async def _run_steps(self, steps: Sequence[Step], tensors: Tensors, parameters: dict[str, InferParameter]) -> None:
        """Run ``steps`` concurrently (one alone: in this task), adding what they produce to ``tensors``."""
        if len(steps) == 1:
            tensors.update(await self._step(steps[0], tensors, parameters))
            return
        for produced in await asyncio.gather(*(self._step(s, tensors, parameters) for s in steps)):
            tensors.update(produced)

    async def _step(self, step: Step, tensors: Tensors, parameters: dict[str, InferParameter]) -> Tensors:
        """Run one step: its ensemble tensors, each with the batch size of the request that made it,
        leaving out the empty ones; the outputs its model did not produce come back empty."""
        request, batch = self._request(step, tensors, parameters)
        response, _ = await self._runner(request)
        return self._produced(step, response, batch)

    @staticmethod
    def _request(step: Step, tensors: Tensors, parameters: dict[str, InferParameter]) -> tuple[InferRequest, int]:
        """A step's request (its ensemble tensors as read-only views, each with the batch size of the
        request that made it, leaving out the empty ones; ``parameters`` shared, read-only) and the
        batch size of its outputs."""
        inputs: list[InputTensor] = []
        raw: list[Buffer] = []
        batch = 0
        for binding in step.inputs:
            array, produced_by = tensors[binding.ensemble_tensor]
            if array is None:
                continue
            shape = reshape_between(binding.dims, step.batching, produced_by, array.shape)
            if step.batching and not batch and shape:
                batch = shape[0]
            inputs.append(InputTensor(binding.model_tensor, binding.dtype.v2, shape))
            data = as_buffer(array, binding.dtype)  # a view where it can be: the step's model must not write to it
            raw.append(data.toreadonly() if isinstance(data, memoryview) else data)
        version = str(step.model_version) if step.model_version > 0 else ""
        header = RequestHeader(step.model_name, version, parameters, inputs,
                               [RequestedOutput(b.model_tensor) for b in step.outputs])
        return InferRequest(header, "", raw), batch

    @staticmethod
    def _produced(step: Step, response: InferResponse, batch: int) -> Tensors:
        """A step's response as ensemble tensors (read-only views of its raw contents): the outputs its
        model did not produce are empty."""
        by_name = {b.model_tensor: b for b in step.outputs}
        produced: Tensors = {b.ensemble_tensor: (None, batch) for b in step.outputs}
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            binding = by_name[tensor.name]
            data = raw.toreadonly() if isinstance(raw, memoryview) else raw
            array = from_raw(data, binding.dtype, tensor.shape, f"output '{tensor.name}' of model '{step.model_name}'")
            produced[binding.ensemble_tensor] = (array, batch)
        return produced

    def stop(self) -> None:
        """Nothing is queued here: each step's request is its model's."""

    def close(self) -> None:
        """Nothing to release: an ensemble has no backend."""


def _without(steps: Sequence[Step], ran: Sequence[Step]) -> list[Step]:
    """``steps`` but those in ``ran`` (by index: comparing the steps' fields would cost more)."""
    done = {s.index for s in ran}
    return [s for s in steps if s.index not in done]


class _Answers:
    """The responses of one decoupled step's request, read from the server's stream call as they come
    (in a task of their own, so that whether the step has sent its final flag is known at once).

    Args:
        responses: the step's responses (``StepStreamer``), the last one final.
    """

    def __init__(self, responses: AsyncGenerator[Streamed, None]) -> None:
        self._waiting: deque[Streamed] = deque()  # responses with outputs or an error, not yet taken
        self._error: Exception | None = None
        self._done = False
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(responses))

    async def _read(self, responses: AsyncGenerator[Streamed, None]) -> None:
        try:
            async with aclosing(responses):
                async for item in responses:
                    if item.response is not None or item.error is not None:
                        self._waiting.append(item)
                    if item.final:
                        self._done = True
                    self._wake.set()
                    if item.final:
                        break
        except Exception as err:  # noqa: BLE001 - the step failed before responding: the ensemble's error
            self._error = err
        finally:
            self._done = True
            self._wake.set()

    @property
    def exhausted(self) -> bool:
        """Whether no response of the step is left to come or to be taken."""
        return self._done and not self._waiting and self._error is None

    async def next(self) -> Streamed | None:
        """The step's next response (outputs or an error), or None after its last one.

        Raises:
            Whatever the step's stream call raised before its model responded.
        """
        while not self._waiting:
            if self._done:
                if self._error is not None:
                    raise self._error
                return None
            self._wake.clear()
            await self._wake.wait()
        return self._waiting.popleft()

    def cancel(self) -> None:
        """Stop reading: a request still answering is cancelled (its model sees ``is_cancelled()``)."""
        self._task.cancel()
