"""Python model instances run in processes of their own, as Triton runs each instance in its stub
process (Triton's "Python Backend" documentation): chosen per model by the configuration parameter
``EXECUTION_MODE``, or for the server by ``--backend-config=python,execution-mode=process``
(``kserve_v2.runtime.python.backend``).

``ProcessModel`` stands where the model's class stands in the in-process mode (the backend asks it
for ``auto_complete_config`` and calls it for each instance): each ``ProcessInstance`` it makes is a
proxy whose ``initialize``, ``execute`` and ``finalize`` run in its stub process
(``kserve_v2.runtime.python.stub``), so ``PythonModel`` batches, answers, counts and reports errors
as it does for in-process instances. Tensors travel through the instance's shared memory region
(``kserve_v2.runtime.python.shm``) with the sizes of Triton's ``--backend-config=python,...``
settings (the server's ``BackendHost.backend_config.python``); the server copies the outputs out of it. The two
sides talk through ``protocol.Link``: typed, numbered calls both ways, each answered by its reply.
A response the model sends through a request's sender, also from a thread after ``execute``
returned (a decoupled model's usual way), reaches the server's sender of that request, whose errors
(Triton's texts) the model's ``send`` raises; ``is_cancelled`` asks the server. What model code asks of the server runs here,
as the execution that asked: business logic scripting (``exec``, ``async_exec``, and the response
iterator of a decoupled model's, with ``cancel``), custom metrics and the model loading API. A stub process that dies (a
crash, ``os._exit``, killed for memory) fails the execution's requests with Triton's text
"Failed to process the request(s) for model instance '<instance>', message: Stub process
'<instance>' is not healthy." and is started (and initialized) again at the instance's next request;
the server goes on. So does one that does not answer a call of the server's (``Load``,
``AutoComplete``, ``Initialize``, ``Execute``, ``Finalize``) within Triton's
``--backend-config=python,stub-timeout-seconds=<s>`` (default 30): it is killed (SIGKILL) and the
error logged, naming the instance and the timeout.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import logging
import os
import re
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

from kserve_v2.backend.host import BackendHost
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import ModelConfig
from kserve_v2.runtime.python.environments import Environment, stub_command
from kserve_v2.backend.custom_metrics import MetricKind
from kserve_v2.backend.decoupled import CLOSED
from kserve_v2.runtime.python.executing import InstanceFailure, ModelCodeError
from kserve_v2.runtime.python.in_process import InProcessHost
from kserve_v2.runtime.python.model import MORE_THAN_ONE
from kserve_v2.runtime.python.protocol import (AutoComplete, Bls, BlsCancel, BlsNext, BlsStream, CallTimeout, Cancelled,
                                               Control, Executed, Execute, Finalize, Initialize, Link, LinkClosed, Load,
                                               Message, MetricFamily, MetricFamilyGone, MetricOf, MetricOp, RemoteError,
                                               Reply, RequestData, ResponseData, Send, ServerCall)
from kserve_v2.runtime.python.shm import Region, Sizes, Slot
from kserve_v2.runtime.python.stub import inline_data
from kserve_v2.runtime.python.tensors import InferenceResponse, Tensor, TritonError, TritonModelException

log = logging.getLogger(__name__)
_regions = itertools.count(1)
_regions_lock = threading.Lock()
_live: set[ProcessInstance] = set()  # instances whose region exists
# a model answered once that returns None for a request and sent nothing before execute returned
NOT_ANSWERED = ("the model returned no response for the request and sent none before execute returned (a response "
                "sent later is not supported with EXECUTION_MODE 'process')")


def _unhealthy(name: str) -> InstanceFailure:
    """Triton's error of the requests of an instance whose stub died (python_backend src/stub_launcher.cc)."""
    return InstanceFailure(f"Failed to process the request(s) for model instance '{name}', message: Stub process "
                           f"'{name}' is not healthy.")


class ProcessInstance:
    """One instance's stub process and shared memory region, as an instance object of the model's
    class: ``initialize``, ``execute`` and ``finalize`` run in the stub process.

    Args:
        path: the model file.
        model_name: the model's name.
        host: the server that loads it: its python backend settings size the region (Triton's
            ``shm-default-byte-size``, ``shm-growth-byte-size``, ``shm-region-prefix-name``) and bound
            each call to the stub (``stub-timeout-seconds``), and what the model asks of the server
            runs with it.
        environment: the model's ``EXECUTION_ENV_PATH`` environment, whose interpreter runs the stub;
            None: the server's.

    Raises:
        ValueError: the stub cannot start, or the model file fails to import there (its text).
    """

    def __init__(self, path: Path, model_name: str, host: BackendHost, environment: Environment | None = None) -> None:
        self._path, self._model_name, self._host, self._environment = path, model_name, host, environment
        self.name = model_name  # the instance's name once initialized
        self._args: dict[str, str] | None = None
        self._decoupled = False
        with _regions_lock:
            number = next(_regions)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model_name)
        python = host.backend_config.python
        self._sizes = Sizes(python.shm_default_byte_size, python.shm_growth_byte_size, python.shm_region_prefix_name)
        self._region = Region(f"{self._sizes.prefix}{safe}_{os.getpid()}_{number}", self._sizes.default_byte_size,
                              create=True)
        self._timeout = python.stub_timeout_seconds
        self._process: subprocess.Popen[bytes] | None = None
        self._link: Link | None = None
        # requests that may still get responses from the stub, by execution and index (a decoupled
        # model's, and those a model answered once left to its sender), until their final response
        self._open: dict[tuple[int, int], pb_utils.InferenceRequest] = {}
        self._executions = itertools.count()
        self._running: dict[int, InProcessHost] = {}  # what each execution runs as (its BLS requests too)
        self._latest: InProcessHost | None = None
        self._metrics: list[Any] = []  # the model's metric families and metrics, by number
        self._streams: dict[int, Any] = {}  # the response iterators of its BLS requests to decoupled models
        self._stream_numbers = itertools.count()
        _live.add(self)
        try:
            self.completes = self._start()
        except BaseException:
            self.release()
            raise

    @property
    def pid(self) -> int | None:
        """The stub process's id (None when none runs)."""
        return self._process.pid if self._process is not None else None

    def _start(self) -> bool:
        """Start the stub process and import the model file there; whether it has ``auto_complete_config``."""
        ours, theirs = socket.socketpair()
        settings = {"fd": theirs.fileno(), "region": self._region.name, "size": self._region.size,
                    "default_byte_size": self._sizes.default_byte_size, "growth_byte_size": self._sizes.growth_byte_size,
                    "prefix": self._sizes.prefix, "log_level": logging.getLogger("kserve_v2").getEffectiveLevel()}
        with theirs:
            environment = self._environment
            self._process = subprocess.Popen([*stub_command(environment), json.dumps(settings)],
                                             pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                             env=environment.variables if environment is not None else None,
                                             start_new_session=True)  # a terminal's Ctrl-C is the server's to handle
        link = self._link = Link(ours, f"python-stub-{self.name}", self._fail_open)
        link.serve(lambda number, message: self._take(link, number, message))
        try:
            return bool(self._call(Load(str(self._path), self._model_name)))
        except ModelCodeError as err:
            raise ValueError(err.text) from None

    def auto_complete_config(self, config: ModelConfig) -> Any:
        """Run the model's ``auto_complete_config`` in the stub: what it returned (a ``ModelConfig``, or
        None when it returned something else).

        Raises:
            ModelCodeError: it raised (its text).
            InstanceFailure: the stub died, or did not answer within ``stub-timeout-seconds`` (killed).
        """
        body = self._call(AutoComplete(json.dumps(config.as_dict())))
        return ModelConfig(json.dumps(body)) if body is not None else None

    def initialize(self, args: dict[str, str]) -> None:
        """Initialize the model's instance in the stub with Triton's ``args``; the stub stops when it fails.

        Raises:
            ModelCodeError: ``initialize`` raised (its text).
            InstanceFailure: the stub died, or did not answer within ``stub-timeout-seconds`` (killed).
        """
        self._args = dict(args)
        self.name = args["model_instance_name"]
        self._latest = self._host_now()  # the version's: custom metric families created in initialize are its
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        try:
            self._call(Initialize(self._args))
        except BaseException:
            self.release()
            raise

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[InferenceResponse | None] | None:
        """Run ``execute`` in the stub: what it returned, each response's outputs copied out of the
        region (None: it returned None; a decoupled model's responses went through the senders).
        Responses the model sends through a request's sender (during ``execute`` or after it, from
        threads it started) go to the server's sender of that request (``_take``), whose errors the
        model's ``send`` raises.

        Raises:
            ModelCodeError: ``execute`` raised (its text).
            InstanceFailure: the stub died, or did not answer within ``stub-timeout-seconds`` and was
                killed (Triton's text); it starts again at the next request.
        """
        if self._process is None or self._process.poll() is not None:
            self._restart()
        named = [(tensor.name(), tensor.as_numpy()) for request in requests for tensor in request.inputs()]
        slots = iter(self._region.write(named, 0, self._sizes))
        data = [RequestData(request.request_id(), request.correlation_id(), request.flags(),
                            json.loads(request.parameters()), [next(slots) for _ in request.inputs()],
                            list(request.requested_output_names())) for request in requests]
        execution = next(self._executions)
        for index, request in enumerate(requests):
            self._open[execution, index] = request
        self._running[execution] = self._latest = self._host_now()  # what its BLS requests run as
        try:
            executed: Executed = self._call(Execute(execution, self._region.size, data))
        except ModelCodeError:
            self._close(execution, len(requests))
            raise
        finally:
            self._running.pop(execution, None)
        self._region.remap(executed.size)
        for index, request in enumerate(requests):
            if executed.again[index]:  # given back: the scheduler executes it again
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                self._open.pop((execution, index), None)
        responses = executed.responses
        if responses is None:
            return None if self._decoupled else [None] * len(requests)
        if self._decoupled:
            return []  # returned something: the caller refuses it (Triton's text)
        for index, response in enumerate(responses):
            if response is not None:
                self._open.pop((execution, index), None)
        return [self._response(response) if response is not None else None for response in responses]

    def finalize(self) -> None:
        """Run the model's ``finalize`` in the stub and stop it (and remove the region).

        Raises:
            ModelCodeError: ``finalize`` raised (its text; the stub stops all the same).
        """
        try:
            if self._process is not None and self._process.poll() is None:
                self._call(Finalize())
        except InstanceFailure:
            pass
        finally:
            self.release()

    def _close(self, execution: int, count: int) -> None:
        """The requests of ``execution`` get no more responses from the stub."""
        for index in range(count):
            self._open.pop((execution, index), None)

    def _response(self, data: ResponseData) -> InferenceResponse:
        """A response from the stub, its outputs copied out of the region (or unpickled)."""
        tensors = [Tensor(out.name, self._region.read(out, copy=True)) if isinstance(out, Slot) else Tensor(*out)
                   for out in data.outputs]
        return InferenceResponse(tensors, TritonError(*data.error) if data.error is not None else None,
                                 data.parameters)

    def _call(self, message: ServerCall) -> Any:
        """Send ``message`` to the stub and wait for its reply's value, ``stub-timeout-seconds`` at most
        (the link's reader answers the stub's own calls meanwhile).

        Raises:
            ModelCodeError: the model's code failed the call (its text).
            InstanceFailure: the stub died, or gave no reply in time and was killed (SIGKILL); Triton's text.
        """
        assert self._link is not None
        try:
            return self._link.call(message, self._timeout)
        except RemoteError as err:
            raise ModelCodeError(err.text) from None
        except CallTimeout:
            log.error("the stub process of python model instance '%s' did not answer %s within stub-timeout-seconds "
                      "(%s s): killed; its requests fail; it restarts at the next request", self.name,
                      type(message).__name__, self._timeout)
            if self._process is not None:
                self._process.kill()
        except LinkClosed:
            code = self._process.wait() if self._process is not None else None
            log.error("the stub process of python model instance '%s' exited (exit code %s): its requests fail; it "
                      "restarts at the next request", self.name, code)
        self._stop()
        raise _unhealthy(self.name)

    def _take(self, link: Link, number: int, message: Message) -> None:
        """The link's handler: answer a call of the stub's. Responses, cancellation checks and custom
        metrics are answered at once; business logic scripting and model control may wait, a thread each."""
        match message:
            case Send(execution, index, response, final, size):
                self._region.remap(size)
                link.answer(number, functools.partial(self._send, execution, index, response, final))
            case Cancelled(execution, index):
                request = self._open.get((execution, index))
                link.reply(Reply(number, request is None or request.is_cancelled()))
            case MetricFamily() | MetricOf() | MetricOp() | MetricFamilyGone():
                link.answer(number, functools.partial(self._metric, message))
            case Bls() | BlsStream() | BlsNext() | BlsCancel() | Control():
                threading.Thread(target=link.answer, args=(number, functools.partial(self._asked, message)),
                                 name=f"python-stub-{self.name}-{type(message).__name__}", daemon=True).start()
            case _:
                link.reply(Reply(number, error=f"{type(message).__name__} is not a call to the server"))

    def _fail_open(self) -> None:
        """The stub is gone: the requests that could still get responses from it fail with Triton's text."""
        failure = InferenceResponse(error=TritonError(str(_unhealthy(self.name))))
        for key in list(self._open):
            request = self._open.pop(key, None)
            if request is not None:
                try:
                    request.get_response_sender().send(failure, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception:  # noqa: BLE001, S110 - already answered or closed
                    pass

    def _host_now(self) -> InProcessHost:
        """What the server runs this instance's calls as (``PythonModel`` sets it around each call)."""
        host = pb_utils.RUNNING.get()
        return host if isinstance(host, InProcessHost) else InProcessHost("", None, (), host=self._host)

    def _as(self, execution: int | None) -> InProcessHost:
        """The host the stub's call runs as: its execution's (or the latest one's: a thread the model
        started, ``initialize``, ``finalize``)."""
        running = self._running.get(execution, self._latest) if execution is not None else self._latest
        return running or InProcessHost("", None, (), host=self._host)

    def _asked(self, message: Bls | BlsStream | BlsNext | BlsCancel | Control) -> Any:
        """Run a request the model sent (business logic scripting: ``exec``, its response stream) or a model
        control call (``load_model``, ``unload_model``, ``is_model_ready``) as the execution that sent it."""
        host = self._as(message.execution)
        match message:
            case Bls(_, fields):
                return inline_data(host.infer(_built(fields)))
            case BlsStream(_, fields):
                stream = next(self._stream_numbers)
                self._streams[stream] = host.stream(_built(fields))
                return stream
            case BlsNext(_, stream):
                try:
                    return inline_data(next(self._streams[stream]))
                except StopIteration:
                    self._streams.pop(stream, None)
                    return None
            case BlsCancel(_, stream):
                self._streams[stream].cancel()
                return None
            case Control(_, method, request):
                return getattr(host, method)(request)

    def _metric(self, message: MetricFamily | MetricOf | MetricOp | MetricFamilyGone) -> Any:
        """A custom metric call of the model's (``pb_utils.MetricFamily`` and ``Metric``, made here as the
        execution, or ``initialize``, that runs it): the new family's or metric's number, or the operation's
        result.

        Raises:
            MetricError: Triton's text of the failure.
        """
        match message:
            case MetricFamily(execution, name, description, kind):
                self._metrics.append(self._as(execution).metric_family(name, description, MetricKind(kind)))
            case MetricOf(_, family, labels, buckets):
                self._metrics.append(self._metrics[family].metric(labels, buckets))
            case MetricFamilyGone(_, family):
                self._metrics[family] = None  # the model deleted it: so is this one (its metrics refuse)
            case MetricOp(_, metric, operation, value):
                found = getattr(self._metrics[metric], operation)
                return found() if value is None else found(value)
        return len(self._metrics) - 1

    def _send(self, execution: int, index: int, response: ResponseData | None, final: bool) -> None:
        """Hand a response the model sent to its request's sender.

        Raises:
            TritonModelException: what the model's ``send`` raises (Triton's texts).
        """
        request = self._open.get((execution, index))
        if request is None:  # answered (a model answered once: its one response) or closed
            raise TritonModelException(MORE_THAN_ONE if response is not None and not self._decoupled else CLOSED)
        request.get_response_sender().send(self._response(response) if response is not None else None,
                                           pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        if final or (response is not None and not self._decoupled):
            self._open.pop((execution, index), None)

    def _restart(self) -> None:
        """Start the stub again after it died, and initialize the instance there.

        Raises:
            InstanceFailure: it cannot start or initialize (logged).
        """
        log.error("restarting the stub process of python model instance '%s'", self.name)
        self._stop()
        try:
            self._start()
            if self._args is not None:
                self._call(Initialize(self._args))
        except (ValueError, ModelCodeError, InstanceFailure) as err:
            log.error("python model instance '%s' failed to start again: %s", self.name, err)
            self._stop()
            raise _unhealthy(self.name) from None

    def _stop(self) -> None:
        """End the stub process: it exits once its socket closes (killed after 5 s). The region stays (a restart
        uses it). The link's reader has failed the requests still open before a restart can open others."""
        if self._link is not None:
            self._link.close(wait=5)
            self._link = None
        if self._process is not None:
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def release(self) -> None:
        """End the stub process and remove the region (an instance that will not run again)."""
        self._open.clear()  # streams still open stay so, as in process
        self._stop()
        if self in _live:
            _live.discard(self)
            self._region.close(unlink=True)


def _built(fields: dict[str, Any]) -> pb_utils.InferenceRequest:
    """A request the model built in the stub (``InferenceRequest.as_fields``, its inputs pickled)."""
    fields = dict(fields)
    inputs = [Tensor(name, array) for name, array in fields.pop("inputs")]
    return pb_utils.InferenceRequest(inputs=inputs, **fields)


@atexit.register
def _release_all() -> None:
    """At the server's exit, remove the regions of the instances still loaded (their stubs exit on EOF)."""
    for instance in list(_live):
        instance.release()


class ProcessModel:
    """What stands for the model's class in ``EXECUTION_MODE`` ``process``: calling it makes an
    instance (a ``ProcessInstance``); the first one is started at once, so that loading imports the
    model file and runs ``auto_complete_config`` in a stub, never in the server.

    Args:
        path: the model file.
        model_name: the model's name.
        host: the server that loads it (``ProcessInstance``).
        environment: the model's ``EXECUTION_ENV_PATH`` environment (``ProcessInstance``), or None.

    Raises:
        ValueError: the stub cannot start, or the model file fails to import there.
    """

    def __init__(self, path: Path, model_name: str, host: BackendHost, environment: Environment | None = None) -> None:
        self._path, self._model_name, self._host, self._environment = path, model_name, host, environment
        self._first: ProcessInstance | None = ProcessInstance(path, model_name, host, environment)
        self.completes = self._first.completes

    def auto_complete_config(self, config: ModelConfig) -> Any:
        """The model's ``auto_complete_config``, run in the first instance's stub (``ProcessInstance.auto_complete_config``)."""
        assert self._first is not None
        return self._first.auto_complete_config(config)

    def __call__(self) -> ProcessInstance:
        first, self._first = self._first, None
        return first if first is not None else ProcessInstance(self._path, self._model_name, self._host,
                                                               self._environment)

    def discard(self) -> None:
        """Stop the first stub when it was not made an instance (the load failed before)."""
        if self._first is not None:
            self._first.release()
            self._first = None
