"""Triton's ensemble scheduler (``ensemble_scheduler.cc``): an ensemble version's ``Scheduler``.

A request runs only the steps its requested outputs need (``ensemble.needed_steps``), each as
soon as its inputs are ready, steps whose inputs are ready concurrently. Each step is a new
``ModelInferRequest`` (carrying the ensemble request's parameters) sent through the server's one
inference call (``InferenceService.model_infer``), so batching, statistics, metrics and tracing
see it like any request; a tensor passed between a model without batching and one with batching
gains or loses a batch dim of 1 (``ensemble.reshape_between``). The response carries
``sequence_id``, ``sequence_start`` and ``sequence_end`` from the request. An optional ensemble
input that the request omits, and a step output that its model did not produce, are empty: a step
is sent without them (its model then decides whether that input may be left out), as Triton's
scheduler does. An ensemble has no backend and no instances: nothing runs here but the steps' own
requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, Execution, Parameter, RequestContext
from kserve_v2.protocol.errors import InternalError
from kserve_v2.protocol.model_spec import MAX_MEMO
from kserve_v2.protocol.tensors import from_raw, to_raw
from kserve_v2.request.encode import set_parameter
from kserve_v2.scheduling.base import Feeds, Outcome
from kserve_v2.scheduling.ensemble import Step, StepRunner, needed_steps, reshape_between


class EnsembleScheduler:
    """Runs an ensemble's requests as requests to its steps' models (see the module docstring).

    Args:
        config: the ensemble's completed configuration (its batching and output dims).
        steps: the validated steps (``ensemble.plan``).
        runner: the server's inference call the steps go through.
    """

    def __init__(self, config: mc.ModelConfig, steps: tuple[Step, ...], runner: StepRunner) -> None:
        self._name = config.name
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

        Raises:
            InternalError: a requested output that its step's model did not produce -> INTERNAL.
            Whatever a step's inference call raises (its model's error, with its status): a step
            model's required input left empty is that model's INVALID_ARGUMENT.
        """
        started = time.perf_counter_ns()
        # Triton's request batch size: 0 for an ensemble without batching
        batch = batch_size if self._batching else 0
        tensors: dict[str, tuple[np.ndarray | None, int]] = {name: (array, batch) for name, array in feeds.items()}
        for name in self._optional:
            tensors.setdefault(name, (None, batch))  # omitted: empty
        key = frozenset(output_names)
        pending = self._needed.get(key)
        if pending is None:
            if len(self._needed) >= MAX_MEMO:
                self._needed.clear()
            pending = self._needed[key] = needed_steps(self._steps, output_names)
        while pending:
            ready = [s for s in pending if all(b.ensemble_tensor in tensors for b in s.inputs)]
            # every step input is an ensemble input or a step's output (ensemble.check_config), and
            # every ensemble input and step output is in ``tensors``, empty or not, once its step ran
            assert ready, f"ensemble '{self._name}': no step can run"
            for produced in await asyncio.gather(*(self._step(s, tensors, parameters) for s in ready)):
                tensors.update(produced)
            pending = tuple(s for s in pending if s not in ready)
        outputs = []
        for name in output_names:
            array, produced_by = tensors[name]
            if array is None:
                raise InternalError(f"ensemble '{self._name}': output '{name}' was not produced by its step's model")
            shape = reshape_between(self._output_dims[name], batch != 0, produced_by, array.shape)
            outputs.append(array.reshape(shape))
        response = {"sequence_id": parameters.get("sequence_id", 0),  # Triton's ensemble answers with these
                    "sequence_start": bool(parameters.get("sequence_start", False)),
                    "sequence_end": bool(parameters.get("sequence_end", False))}
        return Execution(outputs, parameters=response), 0, time.perf_counter_ns() - started

    async def _step(self, step: Step, tensors: Mapping[str, tuple[np.ndarray | None, int]],
                    parameters: Mapping[str, Parameter]) -> dict[str, tuple[np.ndarray | None, int]]:
        """Run one step: its ensemble tensors, each with the batch size of the request that made it,
        leaving out the empty ones; the outputs its model did not produce come back empty."""
        request = pb.ModelInferRequest(model_name=step.model_name,
                                       model_version=str(step.model_version) if step.model_version > 0 else "")
        for key, value in parameters.items():
            set_parameter(request.parameters[key], value)
        batch = 0
        for binding in step.inputs:
            array, produced_by = tensors[binding.ensemble_tensor]
            if array is None:
                continue
            shape = reshape_between(binding.dims, step.batching, produced_by, array.shape)
            if step.batching and not batch and shape:
                batch = shape[0]
            request.inputs.add(name=binding.model_tensor, datatype=binding.dtype.v2, shape=shape)
            request.raw_input_contents.append(to_raw(array, binding.dtype))
        for binding in step.outputs:
            request.outputs.add(name=binding.model_tensor)
        response = await self._runner(request)
        by_name = {b.model_tensor: b for b in step.outputs}
        produced: dict[str, tuple[np.ndarray | None, int]] = {b.ensemble_tensor: (None, batch) for b in step.outputs}
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            binding = by_name[tensor.name]
            array = from_raw(raw, binding.dtype, list(tensor.shape), f"output '{tensor.name}' of model '{step.model_name}'")
            produced[binding.ensemble_tensor] = (array, batch)
        return produced

    def stop(self) -> None:
        """Nothing is queued here: each step's request is its model's."""

    def close(self) -> None:
        """Nothing to release: an ensemble has no backend."""
