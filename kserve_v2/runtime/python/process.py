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
settings (the server's ``BackendHost.python``); the server copies the outputs out of it. A response the model sends
through a request's sender, also from a thread after ``execute`` returned (a decoupled model's
usual way), reaches the server's sender of that request, whose errors (Triton's texts) the model's
``send`` raises; ``is_cancelled`` asks the server. What model code asks of the server runs here,
as the execution that asked: business logic scripting (``exec``, ``async_exec``, and the response
iterator of a decoupled model's, with ``cancel``), custom metrics and the model loading API. A stub process that dies (a
crash, ``os._exit``, killed for memory) fails the execution's requests with Triton's text
"Failed to process the request(s) for model instance '<instance>', message: Stub process
'<instance>' is not healthy." and is started (and initialized) again at the instance's next request;
the server goes on.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import queue
import re
import socket
import subprocess
import threading
from multiprocessing.connection import Connection
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
from kserve_v2.runtime.python.shm import Region, Sizes, Slot
from kserve_v2.runtime.python.stub import ResponseMeta, inline_meta
from kserve_v2.runtime.python.tensors import InferenceResponse, Tensor, TritonError

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
            ``shm-default-byte-size``, ``shm-growth-byte-size``, ``shm-region-prefix-name``), and what
            the model asks of the server runs with it.
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
        python = host.python
        self._sizes = Sizes(python.shm_default_byte_size, python.shm_growth_byte_size, python.shm_region_prefix_name)
        self._region = Region(f"{self._sizes.prefix}{safe}_{os.getpid()}_{number}", self._sizes.default_byte_size,
                              create=True)
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._write = threading.Lock()  # one message at a time on the socket
        self._replies: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
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
        self._socket = ours  # shut down to stop: a thread blocked reading the connection wakes up
        self._conn = Connection(os.dup(ours.fileno()))
        self._replies = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(self._conn, self._replies), name=f"python-stub-{self.name}",
                         daemon=True).start()
        status, body = self._call(("load", str(self._path), self._model_name))
        if status == "error":
            raise ValueError(body)
        return bool(body)

    def auto_complete_config(self, config: ModelConfig) -> Any:
        """Run the model's ``auto_complete_config`` in the stub: what it returned (a ``ModelConfig``, or
        None when it returned something else).

        Raises:
            ModelCodeError: it raised (its text).
        """
        body = self._checked(self._call(("auto_complete", json.dumps(config.as_dict()))))
        return ModelConfig(json.dumps(body)) if body is not None else None

    def initialize(self, args: dict[str, str]) -> None:
        """Initialize the model's instance in the stub with Triton's ``args``; the stub stops when it fails.

        Raises:
            ModelCodeError: ``initialize`` raised (its text).
            InstanceFailure: the stub died.
        """
        self._args = dict(args)
        self.name = args["model_instance_name"]
        self._latest = self._host_now()  # the version's: custom metric families created in initialize are its
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        try:
            self._checked(self._call(("initialize", self._args)))
        except BaseException:
            self.release()
            raise

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[InferenceResponse | None] | None:
        """Run ``execute`` in the stub: what it returned, each response's outputs copied out of the
        region (None: it returned None; a decoupled model's responses went through the senders).
        Responses the model sends through a request's sender (during ``execute`` or after it, from
        threads it started) go to the server's sender of that request (``_read``), whose errors the
        model's ``send`` raises.

        Raises:
            ModelCodeError: ``execute`` raised (its text).
            InstanceFailure: the stub died (Triton's text); it starts again at the next request.
        """
        if self._process is None or self._process.poll() is not None:
            self._restart()
        named = [(tensor.name(), tensor.as_numpy()) for request in requests for tensor in request.inputs()]
        slots = iter(self._region.write(named, 0, self._sizes))
        messages = [(request.request_id(), request.correlation_id(), request.flags(), json.loads(request.parameters()),
                     [next(slots) for _ in request.inputs()], request.requested_output_names()) for request in requests]
        execution = next(self._executions)
        for index, request in enumerate(requests):
            self._open[execution, index] = request
        self._running[execution] = self._latest = self._host_now()  # what its BLS requests run as
        try:
            size, again, metas = self._checked(self._call(("execute", execution, self._region.size, messages)))
        except ModelCodeError:
            self._close(execution, len(requests))
            raise
        finally:
            self._running.pop(execution, None)
        self._region.remap(size)
        for index, request in enumerate(requests):
            if again[index]:  # given back: the scheduler executes it again
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                self._open.pop((execution, index), None)
        if metas is None:
            return None if self._decoupled else [None] * len(requests)
        if self._decoupled:
            return list(metas)  # returned something: the caller refuses it (Triton's text)
        for index, meta in enumerate(metas):
            if meta is not None:
                self._open.pop((execution, index), None)
        return [self._response(meta) if meta is not None else None for meta in metas]

    def finalize(self) -> None:
        """Run the model's ``finalize`` in the stub and stop it (and remove the region).

        Raises:
            ModelCodeError: ``finalize`` raised (its text; the stub stops all the same).
        """
        try:
            if self._process is not None and self._process.poll() is None:
                self._checked(self._call(("finalize",)))
        except InstanceFailure:
            pass
        finally:
            self.release()

    def _close(self, execution: int, count: int) -> None:
        """The requests of ``execution`` get no more responses from the stub."""
        for index in range(count):
            self._open.pop((execution, index), None)

    def _response(self, meta: ResponseMeta) -> InferenceResponse:
        """A response from the stub, its outputs copied out of the region (or unpickled)."""
        outputs, error, parameters = meta
        tensors = [Tensor(out.name, self._region.read(out, copy=True)) if isinstance(out, Slot) else Tensor(*out)
                   for out in outputs]
        return InferenceResponse(tensors, TritonError(*error) if error is not None else None, parameters)

    @staticmethod
    def _checked(reply: tuple[str, Any]) -> Any:
        status, body = reply
        if status == "error":
            raise ModelCodeError(body)
        return body

    def _call(self, message: tuple[Any, ...]) -> tuple[str, Any]:
        """Send ``message`` and wait for its reply (``_read`` answers the stub's sends meanwhile).

        Raises:
            InstanceFailure: the stub died (or its socket broke).
        """
        conn, replies = self._conn, self._replies
        assert conn is not None
        try:
            with self._write:
                conn.send(message)
        except OSError:
            pass  # the reader sees the socket closed too
        reply = replies.get()
        if reply is None:
            code = self._process.wait() if self._process is not None else None
            log.error("the stub process of python model instance '%s' exited (exit code %s): its requests fail; it "
                      "restarts at the next request", self.name, code)
            self._stop()
            raise _unhealthy(self.name)
        return reply[0], reply[1]

    def _read(self, conn: Connection, replies: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        """Take the stub's messages until its socket closes: replies to ``_call``, and the responses and
        cancellation checks of open requests, answered here (also after their ``execute`` returned). When
        the stub dies, its open requests fail with Triton's text."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "send":
                _, number, execution, index, meta, final, size = message
                self._region.remap(size)
                answer: Any = self._send(execution, index, meta, final)
            elif kind in ("bls", "bls_stream", "bls_next", "bls_cancel", "control"):  # they may wait: a thread each
                threading.Thread(target=self._in_thread, args=(conn, *message), name=f"python-stub-{self.name}-{kind}",
                                 daemon=True).start()
                continue
            elif kind.startswith("metric"):
                number = message[1]
                answer = self._metric(kind, message[2], *message[3:])
            elif kind == "cancelled":
                _, number, execution, index = message
                request = self._open.get((execution, index))
                answer = request is None or request.is_cancelled()
            else:
                replies.put(message)
                continue
            try:
                with self._write:
                    conn.send(("reply", number, answer))
            except OSError:
                break
        replies.put(None)
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

    def _in_thread(self, conn: Connection, kind: str, number: int, execution: int | None, *args: Any) -> None:
        """Run a request the model sent (``bls``: business logic scripting, ``exec``) or a model
        control call (``control``: ``load_model``, ``unload_model``, ``is_model_ready``) as the execution
        that sent it and send the result back."""
        host = self._as(execution)
        try:
            if kind in ("bls", "bls_stream"):
                fields = dict(args[0])
                inputs = [Tensor(name, array) for name, array in fields.pop("inputs")]
                request = pb_utils.InferenceRequest(inputs=inputs, **fields)
                if kind == "bls":
                    result: Any = inline_meta(host.infer(request))
                else:
                    result = next(self._stream_numbers)
                    self._streams[result] = host.stream(request)
            elif kind == "bls_next":
                stream = self._streams[args[0]]
                try:
                    result = inline_meta(next(stream))
                except StopIteration:
                    result = None
                    self._streams.pop(args[0], None)
            elif kind == "bls_cancel":
                self._streams[args[0]].cancel()
                result = None
            else:
                method, request = args
                result = getattr(host, method)(request)
            answer: Any = ("ok", result)
        except Exception as err:  # noqa: BLE001 - the model's call raises it
            answer = ("error", str(err))
        try:
            with self._write:
                conn.send(("reply", number, answer))
        except OSError:
            pass  # the stub is gone

    def _metric(self, kind: str, execution: int | None, *args: Any) -> tuple[str, Any]:
        """A custom metric call of the model's (``pb_utils.MetricFamily`` and ``Metric``, made here as the
        execution, or ``initialize``, that runs it): ``("ok", result)`` or ``("error", Triton's text)``."""
        try:
            if kind == "metric_family":
                name, description, metric_kind = args
                self._metrics.append(self._as(execution).metric_family(name, description, MetricKind(metric_kind)))
            elif kind == "metric_of":
                family, labels, buckets = args
                self._metrics.append(self._metrics[family].metric(labels, buckets))
            elif kind == "metric_family_gone":
                self._metrics[args[0]] = None  # the model deleted it: so is this one (its metrics refuse)
            else:
                metric, operation, value = args
                found = getattr(self._metrics[metric], operation)
                return "ok", found() if value is None else found(value)
        except Exception as err:  # noqa: BLE001 - the model's call raises it
            return "error", str(err)
        return "ok", len(self._metrics) - 1

    def _send(self, execution: int, index: int, meta: ResponseMeta | None, final: bool) -> str | None:
        """Hand a response the model sent to its request's sender: None, or the error the model's ``send`` raises."""
        request = self._open.get((execution, index))
        if request is None:  # answered (a model answered once: its one response) or closed
            return MORE_THAN_ONE if meta is not None and not self._decoupled else CLOSED
        try:
            request.get_response_sender().send(self._response(meta) if meta is not None else None,
                                               pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as err:  # noqa: BLE001 - the model's send raises it
            return str(err)
        if final or (meta is not None and not self._decoupled):
            self._open.pop((execution, index), None)
        return None

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
                self._checked(self._call(("initialize", self._args)))
        except (ValueError, ModelCodeError, InstanceFailure) as err:
            log.error("python model instance '%s' failed to start again: %s", self.name, err)
            self._stop()
            raise _unhealthy(self.name) from None

    def _stop(self) -> None:
        """End the stub process: it exits once its socket closes (killed after 5 s). The region stays (a restart uses it)."""
        if self._conn is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the stub is gone already
            self._socket.close()
            self._conn.close()
            self._conn = None
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
