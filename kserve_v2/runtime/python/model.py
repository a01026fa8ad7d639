"""How a python model's version runs its requests (the ``python`` backend's ``Executable``; loading
is ``kserve_v2.runtime.python.backend``): its instances, one ``execute`` per execution on an
instance thread, the requests' senders, and ``PythonBatching`` for the dynamic batcher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, Execution, Parameter, RequestContext
from kserve_v2.backend.cancellation import current
from kserve_v2.backend.decoupled import CLOSED, ResponseStream
from kserve_v2.backend.host import BackendHost
from kserve_v2.backend.instance_groups import instances
from kserve_v2.backend.rescheduling import NOT_CONFIGURED, Rescheduled
from kserve_v2.backend.text import TextContract
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.errors import Cancelled, InternalError, InvalidInput, ServerError
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.protocol.reserved import SCHEDULING_PARAMETERS
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import config_json
from kserve_v2.runtime.python.executing import (InstanceFailure, awaited_as, check_returned, running_as,
                                                serve_loop, text_of)
from kserve_v2.runtime.python.in_process import InProcessHost
from kserve_v2.runtime.python.pb_utils import InferenceResponseSender, received
from kserve_v2.runtime.python.tensors import InferenceResponse, Tensor, TritonError, TritonModelException

log = logging.getLogger(__name__)
# request parameters that Triton gives the model as its correlation id and flags, or keeps for itself
_NOT_PARAMETERS = SCHEDULING_PARAMETERS
_KINDS = {mc.ModelInstanceGroup.KIND_GPU: "GPU", mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}
# Triton's ResponseSender texts (python_backend src/response_sender.cc)
MORE_THAN_ONE = "Unable to send response. Non-decoupled model cannot send more than one response."
FINAL_FIRST = "Unable to send response. Non-decoupled model cannot send complete final before sending a response."


def declarations(config: mc.ModelConfig) -> tuple[tuple[TensorDeclaration, ...], tuple[TensorDeclaration, ...]]:
    """The interface a python model has: what its configuration declares (it has no graph to read),
    with the sequence controls and states the server feeds it."""
    batch = [-1] if config.max_batch_size > 0 else []

    def declared(name: str, data_type: int, dims: Sequence[int], optional: bool = False) -> TensorDeclaration:
        return TensorDeclaration(name, datatypes.BY_CONFIG[mc.DataType.Name(data_type)], (*batch, *dims), optional)

    def shape(tensor: mc.ModelInput | mc.ModelOutput) -> Sequence[int]:
        return tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims

    inputs = [declared(t.name, t.data_type, shape(t), t.optional) for t in config.input]
    outputs = [declared(t.name, t.data_type, shape(t)) for t in config.output]
    sequence = config.sequence_batching
    for control_input in sequence.control_input:
        for control in control_input.control[:1]:
            data_type = (control.data_type if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
                         else mc.TYPE_FP32 if control.fp32_false_true else mc.TYPE_BOOL if control.bool_false_true
                         else mc.TYPE_INT32)
            inputs.append(declared(control_input.name, data_type, [1]))
    for state in sequence.state:
        inputs.append(declared(state.input_name, state.data_type, state.dims))
        outputs.append(declared(state.output_name, state.data_type, state.dims))
    return tuple(inputs), tuple(outputs)


class PythonModel:
    """One version of a python model: its instances (``TritonPythonModel`` objects) and how a request
    reaches them; the ``python`` backend's ``Executable`` (see the module docstring). ``host``: the server
    that opened it; its model code runs with it (``InProcessHost.host``: custom metrics, the model
    loading API). ``package``: what ``executing.import_model_class`` imported the model file as (in
    process): the threads the model starts run as its latest execute (``pb_utils.register``)."""

    batchable = False
    threaded = True
    on_cuda = False
    text: TextContract | None = None

    def __init__(self, model_class: Any, config: mc.ModelConfig, model_dir: Path, version: int, folder: str,
                 host: BackendHost, package: str | None = None) -> None:
        self.name = config.name
        self.inputs, self.outputs = declarations(config)
        self.batching = PythonBatching(self)
        self._folder = folder
        self.decoupled = config.model_transaction_policy.decoupled
        # Triton's core reschedules a request only in an iterative sequence (kserve_v2.backend.rescheduling)
        self._reschedules = config.HasField("sequence_batching") and config.sequence_batching.iterative_sequence
        self._dtypes = {t.name: t.dtype for t in self.outputs}
        self._free = _Free()
        self._instances: list[tuple[Any, str]] = []
        self._loops: dict[str, asyncio.AbstractEventLoop] = {}
        self._owner = object()  # the custom metric families the version creates are its (released at close)
        self._host = host
        self._version = self._latest = InProcessHost(folder, None, (), self._owner, host)
        self._package = package
        if package is not None:
            pb_utils.register(package, lambda: self._latest)
        text = config_json(config)
        for group, placed in instances(config.instance_group):  # count on each GPU listed, as Triton's
            instance_name = placed.name
            args = {"model_config": text, "model_instance_kind": _KINDS.get(group.kind, "CPU"),
                    "model_instance_name": instance_name, "model_instance_device_id": str(placed.device),
                    "model_repository": str(model_dir), "model_version": str(version), "model_name": config.name}
            instance = model_class()
            with running_as(self._version):
                try:
                    if hasattr(instance, "initialize"):
                        instance.initialize(args)
                except (Exception, SystemExit) as err:  # noqa: BLE001 - the load failure reason
                    self.close()
                    raise ValueError(f"python model '{config.name}' instance '{instance_name}' failed to "
                                     f"initialize: {text_of(err)}") from None
            self._instances.append((instance, instance_name))
            self._free.put((instance, instance_name))

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: RequestContext = NO_CONTEXT) -> Execution:
        """Run one request (see ``run``).

        Raises:
            ServerError: the request's error (Triton's texts, see the module docstring).
        """
        share = self.run([feeds], output_names, [context])[0]
        if isinstance(share, Exception):
            raise share
        return share

    def run(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
            contexts: Sequence[RequestContext]) -> list[Execution | Exception]:
        """Run one ``execute`` of a free instance on ``members`` (blocking, on an instance thread):
        one execution (the outputs by ``output_names``; none for a decoupled model, whose responses
        went to its streams) or error per member."""
        contexts = list(contexts) or [NO_CONTEXT] * len(members)
        answers = [_Answer(self, context) for context in contexts]
        requests = [self._request(feeds, output_names, context, answer)
                    for feeds, context, answer in zip(members, contexts, answers, strict=True)]
        callers = max((c.callers for c in contexts), key=len) + (self.name,)
        calls = next((c.calls for c in contexts if c.calls is not None), None)
        # the sequence batcher binds a sequence to one instance (its lane), as Triton's does: its state stays there
        instance, instance_name = self._free.get(next((c.instance for c in contexts if c.instance is not None), None))
        try:
            now = self._latest = InProcessHost(self._folder, calls, callers, self._owner, self._host)
            with running_as(now):
                returned = instance.execute(requests)
            if inspect.iscoroutine(returned):
                returned = self._run_coroutine(awaited_as(now, returned), instance_name, answers)
            if self.decoupled and returned is not None:
                raise TritonModelException(f"Python model '{instance_name}' is using the decoupled mode and the "
                                           "execute function must return None.")
            again = [pb_utils.rescheduled(request) for request in requests]
            if not self.decoupled and returned is not None:
                check_returned(returned, again)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - the execution's requests fail; the model serves on
            log.error("python model '%s' failed to execute", instance_name, exc_info=err)
            failure = InternalError(str(err) if isinstance(err, InstanceFailure) else
                                    f"Failed to process the request(s) for model '{instance_name}', message: "
                                    f"{text_of(err)}")
            for answer in answers:
                answer.fail(failure)
            # a request already answered through its sender keeps that answer (Triton sent it already)
            return [failure if answer.response is None else self._share(answer.response, output_names, i == 0)
                    for i, answer in enumerate(answers)]
        finally:
            self._free.put((instance, instance_name))
        given = returned if returned is not None else [None] * len(answers)
        first = again.index(False) if False in again else -1  # the execution counts on its first answered member
        return [self._again(answer) if again[i]
                else Execution([], executions=int(i == first)) if self.decoupled
                else self._share(answer.answer(response, instance_name), output_names, i == first)
                for i, (answer, response) in enumerate(zip(answers, given, strict=True))]

    def _again(self, answer: _Answer) -> Rescheduled | ServerError:
        """A member the model gave back (``set_release_flags`` with RESCHEDULE): its scheduler executes it
        again (an iterative sequence), else it fails with Triton's text, the final response of a stream."""
        if self._reschedules:
            return Rescheduled()
        failure = InvalidInput(NOT_CONFIGURED)
        answer.fail(failure)
        return failure

    def _run_coroutine(self, coroutine: Any, instance_name: str, answers: list[_Answer]) -> Any:
        """Run an ``async def execute`` on the instance's event loop, which runs on a thread of its own
        for as long as the version is loaded (Triton's stub: the tasks it starts go on after it returns).
        A decoupled model's execute runs in the background: the instance is free at once, and its
        executes overlap (Triton's python backend); an exception in it is logged and fails the requests
        still open. A model answered once waits for it."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop(instance_name))
        if not self.decoupled:
            return future.result()

        def done(finished: concurrent.futures.Future[Any]) -> None:
            err = None if finished.cancelled() else finished.exception()
            if err is not None:
                log.error("python model '%s' failed to execute", instance_name, exc_info=err)
                failure = InternalError(f"Failed to process the request(s) for model '{instance_name}', message: "
                                        f"{text_of(err)}")
                for answer in answers:
                    answer.fail(failure)

        future.add_done_callback(done)
        return None

    def _request(self, feeds: dict[str, np.ndarray], output_names: Sequence[str], context: RequestContext,
                 answer: _Answer) -> pb_utils.InferenceRequest:
        parameters = dict(context.parameters)
        correlation_id, start, end = (parameters.get("sequence_id", 0), parameters.get("sequence_start", False),
                                      parameters.get("sequence_end", False))
        for key in _NOT_PARAMETERS:
            parameters.pop(key, None)
        flags = (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if start else 0) | (
            pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if end else 0)
        inputs = [Tensor(name, array) for name, array in feeds.items()]
        sender = InferenceResponseSender(answer.send, answer.cancelled)
        corrid = correlation_id if isinstance(correlation_id, int | str) and not isinstance(correlation_id, bool) else 0
        return received(context.id, corrid, flags, parameters, inputs, output_names, sender, answer.cancelled)

    def outputs_of(self, response: InferenceResponse) -> dict[str, np.ndarray]:
        """A response's outputs by name, those of the configuration only, each as the model made it:
        an output whose numpy type is not the configured one is answered with the model's datatype
        (Triton's python backend sends the tensor's own datatype; its core does not check it)."""
        return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors() if tensor.name() in self._dtypes}

    def _share(self, response: Any, output_names: Sequence[str], first: bool) -> Execution | Exception:
        """One member's execution from the response the model gave it (or the error it waited into)."""
        if isinstance(response, ServerError):
            return response
        error: TritonError | None = response.error()
        if error is not None:
            return error.as_server_error()
        outputs = self.outputs_of(response)
        made = [name for name in output_names if name in outputs]  # the others are left out (Triton's pruning)
        return Execution([outputs[name] for name in made], executions=int(first),
                         parameters=dict(response.parameter_values()) or None,
                         names=None if len(made) == len(output_names) else made)

    def _loop(self, instance_name: str) -> asyncio.AbstractEventLoop:
        """The instance's event loop for ``async def execute``, started on its own daemon thread."""
        loop = self._loops.get(instance_name)
        if loop is None:
            loop = self._loops[instance_name] = asyncio.new_event_loop()
            threading.Thread(target=serve_loop, args=(loop,), name=f"python-{instance_name}-loop", daemon=True).start()
        return loop

    def close(self) -> None:
        """Call each instance's ``finalize`` (errors are logged) and close the instance threads' loops."""
        with running_as(self._version):
            for instance, instance_name in self._instances:
                if hasattr(instance, "finalize"):
                    try:
                        instance.finalize()
                    except (Exception, SystemExit) as err:  # noqa: BLE001 - unloading goes on
                        log.error("finalize of python model '%s' failed", instance_name, exc_info=err)
        self._instances.clear()
        if self._package is not None:
            pb_utils.unregister(self._package)
        self._host.custom_metrics.release(self._owner)  # its metric families go with it (Triton's python backend)
        for loop in self._loops.values():
            loop.call_soon_threadsafe(loop.stop)
        self._loops.clear()


class _Answer:
    """Where one request's responses go: its response stream (a decoupled model), or, for a model
    answered once, the one response it returns or sends through the sender instead (during execute
    or after it returned, from a thread or task it started), with the rules of Triton's
    ``ResponseSender``: a second response, or the final flag before any response, is refused."""

    def __init__(self, model: PythonModel, context: RequestContext) -> None:
        self._model = model
        self._stream: ResponseStream | None = context.responses if model.decoupled else None
        if self._stream is not None:
            self._stream.take()
        self._cancellation = current()
        self.response: InferenceResponse | None = None
        self._sent = 0  # sends so far, a final flag alone included (Triton's count)
        self._closed = False
        self._lock = threading.Lock()
        self._arrived = threading.Event()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        stream = self._stream
        if stream is None:
            if self._model.decoupled:
                raise TritonModelException("this request has no response stream (a decoupled model's requests come "
                                           "through ModelStreamInfer, generate_stream or a decoupled BLS call)")
            with self._lock:
                if response is not None and self._sent:
                    raise TritonModelException(MORE_THAN_ONE)
                if response is None and final and not self._sent:
                    raise TritonModelException(FINAL_FIRST)
                if self._closed:
                    raise TritonModelException(CLOSED)
                self._closed, self._sent = final, self._sent + 1
                if response is not None:
                    self.response = response
            self._arrived.set()
            return
        if stream.closed:
            raise TritonModelException(CLOSED)
        error = response.error() if response is not None else None
        if response is None:
            stream.send(None, None, final)
        elif error is not None:
            stream.send(None, error.as_server_error(), final)
        else:
            stream.send(self._model.outputs_of(response), None, final, dict(response.parameter_values()) or None)

    def answer(self, returned: InferenceResponse | None, instance_name: str) -> InferenceResponse | ServerError:
        """The request's one response once execute returned ``returned`` for it: a response sent
        through the sender wins (a returned one is then dropped, as Triton's frontend drops it);
        with none of either, wait for the sender (a thread or task the model started answers after
        execute returned), until the request is cancelled."""
        with self._lock:
            if self.response is not None:
                if returned is not None:
                    log.error("python model '%s': %s (the response returned by execute is dropped)", instance_name,
                              MORE_THAN_ONE)
                return self.response
            if returned is not None:
                self._closed, self._sent = True, self._sent + 1
                return returned
        cancellation = self._cancellation
        if cancellation is not None:
            cancellation.on_cancel(self._arrived.set)
        while True:
            response = self._received()
            if response is not None:
                return response
            if self.cancelled():
                return Cancelled("the request was cancelled before the model sent its response")
            self._arrived.wait()
            self._arrived.clear()

    def _received(self) -> InferenceResponse | None:
        """The response sent so far (another thread may send it at any time)."""
        return self.response

    def cancelled(self) -> bool:
        if self._stream is not None:
            return self._stream.cancelled
        return self._cancellation is not None and self._cancellation.cancelled

    def fail(self, error: ServerError) -> None:
        """The execution failed: a decoupled request that is still open gets the error as its final response."""
        stream = self._stream
        if stream is not None and not stream.closed:
            stream.send(None, error, True)


class _Free:
    """A version's free instances, a queue in the order they became free: ``get()`` takes the one free
    longest, ``get(k)`` the ``k``-th instance put (modulo their number), the one a scheduler binds the
    execution's requests to; both wait until it is free (any thread)."""

    def __init__(self) -> None:
        self._known: list[tuple[Any, str]] = []  # every instance put, in the order first put
        self._free: deque[tuple[Any, str]] = deque()
        self._changed = threading.Condition()

    def put(self, item: tuple[Any, str]) -> None:
        """``item`` (an instance and its name) is free."""
        with self._changed:
            if not any(known[0] is item[0] for known in self._known):
                self._known.append(item)
            self._free.append(item)
            self._changed.notify_all()

    def get(self, index: int | None = None) -> tuple[Any, str]:
        """Take a free instance (``index``: that one), waiting for it."""
        with self._changed:
            while True:
                if index is None and self._free:
                    return self._free.popleft()
                if index is not None and self._known:
                    wanted = self._known[index % len(self._known)]
                    for position, item in enumerate(self._free):
                        if item[0] is wanted[0]:
                            del self._free[position]
                            return item
                self._changed.wait()


class PythonBatching:
    """How the dynamic batcher hands a python model its requests: several requests in one ``execute``
    call (Triton's dynamic batching of python models), each kept whole (its own inputs, id,
    parameters and sender), never merged into rows; never on the event loop."""

    inline = False

    def __init__(self, model: PythonModel) -> None:
        self._model = model

    def limit(self, config: mc.ModelConfig) -> int:
        """``max_batch_size`` rows (0: no batching)."""
        return config.max_batch_size

    def items(self, feeds: dict[str, np.ndarray], batch_size: int) -> int:
        """The request's rows."""
        return batch_size

    def key(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
            parameters: Mapping[str, Parameter]) -> Hashable:
        """Requests asking for the same outputs with the same inputs present share an ``execute`` (each
        has its own parameters): a model with optional inputs never sees one batch mix requests that
        carry different inputs, as Triton's ``RequiredEqualInputs`` (core ``src/scheduler_utils.cc``)."""
        return tuple(output_names), tuple(sorted(feeds))

    def execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                      parameters: Mapping[str, Parameter], contexts: Sequence[RequestContext] = ()
                      ) -> list[Execution | Exception]:
        """One ``execute`` with a request per member (``PythonModel.run``)."""
        return self._model.run(members, output_names, contexts)
