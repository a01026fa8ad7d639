"""The backend interface: what a loaded model version executes, and the registry of backends.

A model's ``config.pbtxt`` names its backend (Triton's ``backend`` field). ``onnxruntime`` is
built in (``kserve_v2.runtime.onnx``: the graph's tensors are the model's V2 interface). Other
backends (the text adapters in ``adapters/``) are found through the ``kserve_v2.backends``
entry-point group; each entry point names a ``Backend`` (its opener, and what its models offer).
The built-in one is found the same way, by its module's name, so this interface imports no
backend: neither ONNX Runtime nor the adapters. ``python`` (Triton's python backend,
``kserve_v2.runtime.python.backend``) is built in the same way.

A backend's opener opens one version of a model. It is called as ``open(model_dir, version,
config, host)``, ``host`` being the ``BackendHost`` of the server that loads it (its custom metrics,
model code's calls, the python backend's settings, its rate limiter: ``kserve_v2.backend.host``),
or, when it takes only three positional arguments, as ``open(model_dir, version, config)`` (the
shape of backends written before the host existed, still accepted; a backend that needs nothing of
the server may keep it). ``Backend`` tells the two apart once, when it is made, by the opener's
signature.

Each request reaches its backend as its feeds, output names and parameters, and its
``RequestContext``: its ``id``, the models whose executions wait for it (business logic
scripting), and, for a decoupled model, the ``ResponseStream`` its responses go to.

``kserve_v2.backend`` is the import path of this seam for backends written outside this
repository: the names in ``__all__`` (the text contract of ``kserve_v2.backend.text`` and the
tensor declaration included) are what a backend needs.

Modules:

- ``text``: ``TextContract``, the typed contract of a text model: its inputs, outputs and tokenizer limit.
- ``decoupled``: ``ResponseStream``, zero, one or many responses to one request (decoupled models).
- ``local_calls``: ``LocalCalls``, the requests model code sends to other models, and the model control it asks for.
- ``host``: ``BackendHost``, what a server lends the backends that open its models (custom metrics, local
  calls, the python backend's settings, the rate limiter).
- ``custom_metrics``: the metric families model code creates, exported in ``/metrics``.
- ``cancellation``: cancelling a running execution, from the event loop to the backend's thread.
- ``rescheduling``: a request a backend hands back to be executed again (iterative sequences).
- ``instance_groups``: the instances of a version's instance groups, Triton's rule (count on each GPU listed).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Protocol, cast

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.decoupled import ResponseStream
from kserve_v2.backend.host import BackendHost
from kserve_v2.backend.local_calls import LocalCalls
from kserve_v2.backend.text import InputKind, OutputKind, TextContract, TextInput, TextOutput
from kserve_v2.protocol.model_spec import TensorDeclaration

__all__ = [
    "ENTRY_POINT_GROUP", "NO_CONTEXT", "ONNXRUNTIME", "PYTHON", "Backend", "BackendHost", "BatchStrategy", "Executable",
    "Execution", "HostedOpener", "InputKind", "LocalCalls", "Opener", "OutputKind", "Parameter", "RequestContext",
    "ResponseStream", "TensorDeclaration", "TextContract", "TextInput", "TextOutput", "find", "names",
]

ONNXRUNTIME = "onnxruntime"
PYTHON = "python"
ENTRY_POINT_GROUP = "kserve_v2.backends"
# the built-in backends, found as installed ones are
_BUILT_IN = {ONNXRUNTIME: EntryPoint(ONNXRUNTIME, "kserve_v2.runtime.onnx:BACKEND", ENTRY_POINT_GROUP),
             PYTHON: EntryPoint(PYTHON, "kserve_v2.runtime.python.backend:BACKEND", ENTRY_POINT_GROUP)}
# A request parameter's value, as the V2 protocol carries it
Parameter = bool | int | float | str


@dataclass(slots=True)
class Execution:
    """The result of one execution.

    Attributes:
        outputs: one array per requested output, in the requested order.
        pre_ns, post_ns: time spent before and after the model itself (tokenization and
            post-processing, ns); reported as compute input and compute output.
        tokens: tokens the model processed (0 for tensor models).
        executions: model executions this result accounts for (a batch's members share one,
            counted on its first member).
        batch_size: rows (or texts) of the execution this result came from, when the dynamic
            batcher merged requests; 0 means the request's own batch size.
        parameters: the response's parameters (an ensemble's ``sequence_*``), or None.
        names: the outputs that ``outputs`` holds, in the requested order, when the model made only
            some of those requested: the others are left out of the response, as Triton leaves them
            out (python_backend's ``InferResponse::PruneOutputTensors``, an ensemble output no step
            made); None: one array per requested output.
    """

    outputs: list[np.ndarray]
    pre_ns: int = 0
    post_ns: int = 0
    tokens: int = 0
    executions: int = 1
    batch_size: int = 0
    parameters: dict[str, Parameter] | None = None
    names: Sequence[str] | None = None


@dataclass(slots=True, eq=False)
class RequestContext:
    """One request as its backend may see it beyond its tensors (what Triton's backend API reads
    of ``TRITONBACKEND_Request`` besides inputs and parameters).

    Attributes:
        id: the V2 request ``id`` ("" when it has none).
        callers: the models whose executions sent this request and wait for it, outermost first
            (business logic scripting, ``kserve_v2.backend.local_calls``); empty for a client's request.
        responses: where a decoupled model sends this request's responses (``model_transaction_policy
            { decoupled: true }``, ``kserve_v2.backend.decoupled``); None for a request answered once.
        calls: the server's inference calls, for model code that sends requests of its own (business
            logic scripting); None where the request did not come through the service.
        parameters: the request's own parameters (a scheduler hands a batch the parameters of its
            first member; where members may differ, as under the sequence batcher, these are each one's).
        instance: the model instance (index in the instance group's order) a scheduler binds the
            request to: the sequence batcher's, where its sequence stays (Triton's); None: any free one.
    """

    id: str = ""
    callers: tuple[str, ...] = ()
    responses: ResponseStream | None = None
    calls: LocalCalls | None = None
    parameters: Mapping[str, Parameter] = field(default_factory=dict)
    instance: int | None = None


# the context of a request that has none of its own (padding rows, tests)
NO_CONTEXT = RequestContext()


class Executable(Protocol):
    """One loaded version as its backend runs it.

    Attributes:
        inputs, outputs: the V2 interface (names, datatypes, shapes with -1 wildcards), used to
            auto-complete and validate ``config.pbtxt``.
        on_cuda: whether it runs on the CUDA execution provider.
        batchable: whether auto-complete may turn on batching (``max_batch_size``).
        threaded: whether its executions always run on an instance thread: they may wait (on
            other requests, on time) longer than their CPU time shows, so they never run inline on
            the event loop (``InstancePool.runs_inline``).
        batching: how the dynamic batcher merges its requests; None: tensor batching, rows along
            dim 0 (``max_batch_size > 0``; ``dynamic_batcher.RowBatching``).
        text: what it takes and gives as a text model (``kserve_v2.backend.text``); None for a tensor model.
    """

    inputs: tuple[TensorDeclaration, ...]
    outputs: tuple[TensorDeclaration, ...]
    on_cuda: bool
    batchable: bool
    threaded: bool

    @property
    def batching(self) -> BatchStrategy | None: ...

    @property
    def text(self) -> TextContract | None: ...

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: RequestContext = NO_CONTEXT) -> Execution:
        """Run one request (blocking, off the event loop); errors are ``ServerError``s or ORT's.

        A backend that sends the request's responses to ``context.responses`` itself takes the
        stream (``ResponseStream.take``); otherwise the returned execution is its one response.
        """
        ...

    def close(self) -> None:
        """Release what the executable holds, once no execution runs (blocking; unload)."""
        ...


class BatchStrategy(Protocol):
    """How the dynamic batcher merges one executable's requests (Triton's ``dynamic_batching``).

    Attributes:
        inline: whether a request the dynamic batcher would dispatch alone may execute unmerged, on the
            event loop when cheap (the batcher's fast path, ``InstancePool.runs_inline``).
    """

    inline: bool

    def limit(self, config: mc.ModelConfig) -> int:
        """The most items one merged batch holds under ``config``; 0: requests are never merged."""
        ...

    def items(self, feeds: dict[str, np.ndarray], batch_size: int) -> int:
        """A request's size in that limit (``batch_size``: its V2 batch size)."""
        ...

    def key(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
            parameters: Mapping[str, Parameter]) -> Hashable:
        """Requests with equal keys may share a batch."""
        ...

    def execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                      parameters: Mapping[str, Parameter], contexts: Sequence[RequestContext] = ()
                      ) -> list[Execution | Exception]:
        """Run several requests as one execution (blocking); one execution, or the member's own error, per
        member. ``contexts``: the members' contexts, in order (empty: none of them has one)."""
        ...


# (model folder, version, completed configuration) -> the version, or an exception as the load failure reason
Opener = Callable[[Path, int, mc.ModelConfig], Executable]
# the same with the host of the server that loads it (kserve_v2.backend.host)
HostedOpener = Callable[[Path, int, mc.ModelConfig, BackendHost], Executable]


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend as the registry knows it, before any model is opened (the object an entry point names).

    Attributes:
        open: opens one version of a model: an ``Opener`` ``(model_dir, version, config)`` or a
            ``HostedOpener`` ``(model_dir, version, config, host)``, told apart once, here, by its
            signature (an opener that takes four positional arguments gets the host).
        offers: the output kinds its models give as text models (empty for a tensor backend),
            listed for models that are not loaded.
    """

    open: Opener | HostedOpener
    offers: tuple[OutputKind, ...] = ()
    _hosted: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hosted", _takes_host(self.open))

    def open_model(self, model_dir: Path, version: int, config: mc.ModelConfig, host: BackendHost) -> Executable:
        """Open ``version`` of the model in ``model_dir`` with its completed ``config`` for the server ``host``
        (blocking; the loader's thread). Raises what the opener raises: the version's load failure reason."""
        if self._hosted:
            return cast(HostedOpener, self.open)(model_dir, version, config, host)
        return cast(Opener, self.open)(model_dir, version, config)


def _takes_host(opener: Opener | HostedOpener) -> bool:
    """Whether ``opener`` takes four positional arguments (a ``HostedOpener``); False when its
    signature cannot be read (an ``Opener``, the original shape)."""
    try:
        inspect.signature(opener).bind(None, None, None, None)
    except (TypeError, ValueError):
        return False
    return True


def find(name: str) -> Backend | None:
    """Backend ``name``: built in, or an installed entry point's ``Backend``; None if unknown.

    Raises:
        TypeError: the entry point names something that is not a ``Backend``.
    """
    built_in = _BUILT_IN.get(name)
    for entry in (built_in,) if built_in is not None else entry_points(group=ENTRY_POINT_GROUP, name=name):
        found = entry.load()
        if not isinstance(found, Backend):
            raise TypeError(f"entry point '{name}' of {ENTRY_POINT_GROUP} must name a kserve_v2.backend.Backend")
        return found
    return None


def names() -> list[str]:
    """Every backend this installation can run."""
    return sorted({*_BUILT_IN, *(e.name for e in entry_points(group=ENTRY_POINT_GROUP))})
