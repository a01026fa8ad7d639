"""The built-in ``onnxruntime`` backend: ONNX Runtime sessions, and the model they execute.

Session options follow Triton's onnxruntime backend (``config.pbtxt`` ``parameters`` and
``optimization.graph.level``; its ``--backend-config=onnxruntime,...`` thread pools: ``initialize``);
each instance that ``runtime.placement.plan`` places on a GPU has a session on ONNX Runtime's CUDA
execution provider, on its GPU, and the CPU instances share one. ``run`` blocks and must be called
off the event loop. ``BACKEND`` is what ``kserve_v2.backend.find`` returns for ``backend:
"onnxruntime"``: it opens ``<version>/model.onnx`` (or the configured
``default_model_filename``, which must stay inside the model folder) as an ``OnnxModel``.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from queue import SimpleQueue

import numpy as np
import onnxruntime as ort

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, Backend, BackendHost, BatchStrategy, Execution, Parameter, RequestContext
from kserve_v2.backend.cancellation import current
from kserve_v2.backend.text import TextContract
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import BF16, BYTES
from kserve_v2.protocol.errors import Cancelled, InvalidInput
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.runtime.device import CPU_EP, CUDA_EP, OPENVINO, OPENVINO_EP, cuda_device_count
from kserve_v2.backend.instance_groups import KIND_GPU, Instance
from kserve_v2.runtime.placement import cuda_parameters, cuda_provider_options, no_cuda_reason, plan
from kserve_v2.settings.backend_config import OnnxRuntimeBackendConfig

log = logging.getLogger(__name__)

_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}
_BF16_ONNX_ELEMENT_TYPE = 16
# ORT statuses a kernel returns for values it cannot work on (the request's fault, not the server's)
_VALUE_ERRORS = (ort.capi.onnxruntime_pybind11_state.InvalidArgument,
                 ort.capi.onnxruntime_pybind11_state.RuntimeException)
THREAD_PARAMETERS = ("intra_op_thread_count", "inter_op_thread_count")
# ONNX Runtime's global thread pools of this process (intra-op, inter-op threads), once made: its
# environment is process-wide, and once made they cannot be replaced ("Global thread pools have
# already been created, cannot replace them"); None: every session has pools of its own
_global_pools: tuple[int, int] | None = None
_global_pools_lock = threading.Lock()


def initialize(settings: OnnxRuntimeBackendConfig) -> None:
    """Act on the onnxruntime backend's ``--backend-config`` thread settings before a model's
    sessions open (Triton's onnxruntime backend does so once, in ``OnnxLoader::Init``).

    ``enable-global-threadpool``: the first call makes ONNX Runtime's global thread pools, of
    ``intra_op_thread_count`` and ``inter_op_thread_count`` threads (0: ONNX Runtime's default),
    and every session opened after it runs on them (``session_options``), the text backends'
    included; a model's own thread count parameters then have no effect, as in Triton. ONNX
    Runtime's environment is process-wide: so are the pools, and a python model run in the
    server's process that opens sessions of its own must set ``use_per_session_threads = False``.
    Without it the two thread counts have no effect, as in Triton (a model's ``parameters`` set
    its sessions' threads): that is logged once.

    Raises:
        ValueError: an ONNX Runtime whose Python API cannot make global thread pools
            (``onnxruntime.set_global_thread_pool_sizes``: older releases have none); global pools this
            process already made with other sizes (another server in the same process). The
            model's load fails with this reason.
    """
    global _global_pools
    sizes = (settings.intra_op_thread_count, settings.inter_op_thread_count)
    if not settings.enable_global_threadpool:
        if any(sizes):
            _warn_once("--backend-config=onnxruntime,intra_op_thread_count / inter_op_thread_count size the global "
                       "thread pools and have no effect without enable-global-threadpool=1 (as in Triton); a "
                       "model's parameters intra_op_thread_count and inter_op_thread_count set its sessions' threads")
        return
    with _global_pools_lock:
        if _global_pools == sizes:
            return
        if _global_pools is not None:
            raise ValueError(f"ONNX Runtime's global thread pools of this process have {_global_pools[0]} intra-op and "
                             f"{_global_pools[1]} inter-op threads; they cannot be replaced with {sizes[0]} and {sizes[1]}")
        make = getattr(ort, "set_global_thread_pool_sizes", None)
        if make is None:
            raise ValueError(f"--backend-config=onnxruntime,enable-global-threadpool=1 needs ONNX Runtime's global thread "
                             f"pools, which the Python API of ONNX Runtime {ort.__version__} cannot make "
                             "(onnxruntime.set_global_thread_pool_sizes)")
        make(*sizes)
        _global_pools = sizes
        log.info("onnxruntime backend: every session runs on ONNX Runtime's global thread pools: %d intra-op and "
                 "%d inter-op threads (0: ONNX Runtime's default)", *sizes)


@cache
def _warn_once(text: str) -> None:
    log.warning(text)


def session_options(parameters: Mapping[str, str], graph_level: int, spinning: bool = False) -> ort.SessionOptions:
    """Build ORT session options from config parameters (Triton's onnxruntime backend names).

    Recognised: ``intra_op_thread_count``, ``inter_op_thread_count`` (``THREAD_PARAMETERS``),
    ``execution_mode`` (0 sequential, 1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, and
    our ``allow_spinning`` (default: ``spinning``); others are ignored, as Triton does.
    ``graph_level``: -1 basic, 1 extended, else all. Once this process has ONNX Runtime's global
    thread pools (``initialize``), the session runs on them (``use_per_session_threads`` false) and
    the thread counts are not read, as Triton's backend disables per-session threads.

    Raises:
        ValueError: a recognised parameter with a non-integer value.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = _GRAPH_LEVELS.get(graph_level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if _global_pools is not None:
        options.use_per_session_threads = False
    else:
        if "intra_op_thread_count" in parameters:
            options.intra_op_num_threads = int(parameters["intra_op_thread_count"])
        if "inter_op_thread_count" in parameters:
            options.inter_op_num_threads = int(parameters["inter_op_thread_count"])
    if int(parameters.get("execution_mode", "0")) == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.enable_cpu_mem_arena = bool(int(parameters.get("enable_mem_arena", "1")))
    options.enable_mem_pattern = bool(int(parameters.get("enable_mem_pattern", "1")))
    # A spinning intra-op pool steals the cores the front ends need between requests: off unless
    # the caller runs long executions, where waking the pool for every parallel section costs more.
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     parameters.get("allow_spinning", "1" if spinning else "0"))
    return options


def open_session(path: Path, config: mc.ModelConfig, spinning: bool = False) -> OnnxSession:
    """The session of the first instance of a completed configuration (its first instance group; a
    KIND_GPU group's first GPU), for backends that run one session (the text backends, ``adapters``).
    Options from its ``parameters`` and graph level (``session_options``), the CUDA execution provider
    for KIND_GPU (``runtime.placement.cuda_provider_options``). When the groups place instances on
    other GPUs as well, one line says that only this one is used.
    ``spinning``: the default of ``allow_spinning`` (``session_options``).

    Raises:
        ValueError: a malformed session or CUDA provider parameter; anything ORT raises for an invalid model.
    """
    group = config.instance_group[0]
    first = Instance(group.name, 0, group.kind, group.gpus[0] if group.kind == KIND_GPU else 0)
    gpus = cuda_device_count()
    used = {first.device} if first.on_gpu else set()
    if others := sorted({p.device for p in plan(config.instance_group, gpus) if p.on_gpu} - used):
        log.warning("model '%s': this backend runs one ONNX Runtime session, %s; config field 'instance_group.gpus' "
                    "also places instances on GPU(s) %s, which it does not use", config.name,
                    f"on GPU {first.device}" if first.on_gpu else "on the CPU", others)
    return _open_sessions(path, config, spinning, [first], gpus)[0]


def open_sessions(path: Path, config: mc.ModelConfig, spinning: bool = False) -> list[OnnxSession]:
    """One session per instance of a completed configuration, as ``runtime.placement.plan`` places
    them (Triton: ``count`` instances on each GPU of a KIND_GPU group, ``count`` on the CPU for
    KIND_CPU): each GPU instance has a session of its own on its GPU (the CUDA execution provider's
    ``device_id``, and the CUDA options of ``parameters``); the CPU instances share one session (ORT
    runs concurrent calls on one session). Options as ``open_session``.

    Returns:
        the sessions, in the plan's order (the shared CPU session once per CPU instance).

    Raises:
        ValueError: a malformed session or CUDA provider parameter, a GPU that is not usable;
            anything ORT raises for an invalid model.
    """
    gpus = cuda_device_count()
    return _open_sessions(path, config, spinning, plan(config.instance_group, gpus), gpus)


def _open_sessions(path: Path, config: mc.ModelConfig, spinning: bool, placements: Sequence[Instance],
                   gpus: int) -> list[OnnxSession]:
    """The sessions of ``placements`` (``gpus``: the usable GPUs), logging once for each GPU setting
    that has no effect: ``instance_group.gpus`` of a KIND_CPU group, and the CUDA provider
    parameters when no instance runs on a GPU (naming them and why)."""
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    options = session_options(parameters, config.optimization.graph.level, spinning)
    cuda = cuda_provider_options(parameters, 0)  # checks them, GPU or not: a bad value fails the load
    accelerators = cpu_accelerators(config)
    if cpu_gpus := [group.name for group in config.instance_group if group.kind != KIND_GPU and group.gpus]:
        log.warning("model '%s': config field 'instance_group.gpus' has no effect on KIND_CPU instance group(s) "
                    "%s: their instances run on the CPU", config.name, cpu_gpus)
    if _global_pools is not None and (keys := [key for key in THREAD_PARAMETERS if key in parameters]):
        log.warning("model '%s': parameters %s have no effect: its sessions run on ONNX Runtime's global thread pools "
                    "(--backend-config=onnxruntime,enable-global-threadpool=1)", config.name, keys)
    if (keys := cuda_parameters(parameters)) and not any(placed.on_gpu for placed in placements):
        log.warning("model '%s': parameters %s have no effect: %s, so the model runs on the CPU", config.name,
                    keys, no_cuda_reason(CUDA_EP in ort.get_available_providers(), gpus))
    sessions: list[OnnxSession] = []
    on_cpu: OnnxSession | None = None
    for placed in placements:
        if placed.on_gpu:
            sessions.append(OnnxSession(path, options, {**cuda, "device_id": str(placed.device)}, accelerators))
            continue
        if on_cpu is None:
            on_cpu = OnnxSession(path, options, None, accelerators)
        sessions.append(on_cpu)
    return sessions


def cpu_accelerators(config: mc.ModelConfig) -> list[tuple[str, dict[str, str]]]:
    """The execution providers that ``optimization.execution_accelerators.cpu_execution_accelerator``
    asks for, in order, ahead of ONNX Runtime's CPU provider (Triton's onnxruntime backend, "Model
    Config Options"): ``openvino`` is the OpenVINO execution provider on the CPU.

    Raises:
        ValueError: a name other than ``openvino`` (Triton's text, "unknown Execution Accelerator
            '<name>' is requested"), or ``openvino`` with an ONNX Runtime built without it (the
            ``onnxruntime-openvino`` package has it, installed ahead of ``onnxruntime`` on
            PYTHONPATH); the model's load fails with this reason.
    """
    providers: list[tuple[str, dict[str, str]]] = []
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        if accelerator.name != OPENVINO:
            raise ValueError(f"unknown Execution Accelerator '{accelerator.name}' is requested")
        if OPENVINO_EP not in ort.get_available_providers():
            raise ValueError(f"Execution Accelerator '{OPENVINO}' needs ONNX Runtime with the OpenVINO execution "
                             f"provider (the onnxruntime-openvino package, ahead of onnxruntime on PYTHONPATH); this ONNX Runtime "
                             f"{ort.__version__} has {ort.get_available_providers()}")
        providers.append((OPENVINO_EP, {"device_type": "CPU"}))
    return providers


class OnnxSession:
    """One ORT InferenceSession and how to feed it.

    Thread-safe: ORT allows concurrent ``run`` calls on one session, which is how a version's CPU
    instances (``count`` concurrent executions) share it.
    """

    def __init__(self, model_path: Path, options: ort.SessionOptions, cuda: Mapping[str, str] | None,
                 accelerators: Sequence[tuple[str, dict[str, str]]] = ()) -> None:
        """Load the model; ``cuda``: the CUDA execution provider's options (``device_id`` and those of
        ``runtime.placement.cuda_provider_options``), None on the CPU; ``accelerators``: execution
        providers to put ahead of the CPU provider (``cpu_accelerators``). A CUDA provider that ONNX
        Runtime does not start (it falls back to the CPU) is logged, naming the GPU.

        Raises:
            ValueError: an accelerator that ONNX Runtime did not start (it falls back to the CPU
                provider, printing why).
            ValueError: a graph with BYTES inputs and BF16 tensors (ORT's Python API can feed
                neither alongside the other).
            Exception: whatever ORT raises for an unreadable or invalid model (reported by the
                caller as the load failure reason).
        """
        providers: list[str | tuple[str, dict[str, str]]] = [*accelerators, CPU_EP]
        if cuda is not None:
            providers.insert(0, (CUDA_EP, dict(cuda)))
        self._session = ort.InferenceSession(str(model_path), options, providers=providers)
        started = self._session.get_providers()
        if missing := [name for name, _ in accelerators if name not in started]:
            raise ValueError(f"ONNX Runtime could not start {missing} for this model (it ran {started})")
        if accelerators:
            log.info("%s runs on %s", model_path, ", ".join(started))
        self.on_cuda = started[0] == CUDA_EP
        if cuda is not None and not self.on_cuda:
            log.warning("%s: ONNX Runtime did not start the CUDA execution provider on GPU %s; it runs on %s",
                        model_path, cuda["device_id"], ", ".join(started))
        overridable = tuple(_tensor(t, overridable=True) for t in self._session.get_overridable_initializers())
        self.inputs = tuple(_tensor(t) for t in self._session.get_inputs()) + overridable
        self.outputs = tuple(_tensor(t) for t in self._session.get_outputs())
        self._has_bf16 = any(t.dtype is BF16 for t in self.inputs + self.outputs)
        self._string_inputs = {t.name for t in self.inputs if t.dtype is BYTES}
        if self._has_bf16 and self._string_inputs:
            # bfloat16 reaches ORT's Python API only as OrtValues, and it makes no OrtValue of strings
            bf16 = sorted(t.name for t in self.inputs + self.outputs if t.dtype is BF16)
            raise ValueError(f"ONNX Runtime's Python API cannot run a graph with both BYTES inputs "
                             f"{sorted(self._string_inputs)} and BF16 tensors {bf16}")
        # ORT's IO binding takes no string tensors ("Only binding non-string Tensors is currently
        # supported"): a graph with any runs through session.run, string nodes on the CPU provider
        self._bind_io = self.on_cuda and not any(t.dtype is BYTES for t in self.inputs + self.outputs)
        # passing no RunOptions makes ORT build default ones on every run (~1.5 us)
        self._uncancellable = ort.RunOptions()

    def run(self, feeds: dict[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Execute the model (blocking).

        Args:
            feeds: input name -> array already in the model's shape and dtype; BYTES inputs are
                object arrays of ``bytes`` (ORT string tensors carry UTF-8 text).
            output_names: outputs to compute, in the order to return them.

        Returns:
            One array per name; BYTES outputs as object arrays of ``str``, BF16 as
            ``ml_dtypes.bfloat16``.

        Raises:
            InvalidInput: a BYTES element that is not valid UTF-8, or a kernel that fails on the
                values it was given (ORT's INVALID_ARGUMENT and RUNTIME_EXCEPTION statuses: an index
                out of range, a string that is no number) -> INVALID_ARGUMENT naming the inputs.
            Cancelled: the thread's ``kserve_v2.backend.cancellation`` was cancelled (``RunOptions.terminate``).
            Exception: other ORT execution errors (reported as INTERNAL by the caller).
        """
        if self._string_inputs:
            for name in self._string_inputs.intersection(feeds):
                feeds[name] = _as_text(feeds[name], name)
        cancellation = current()
        if cancellation is None:  # inline executions cannot be cancelled: the shared options, never terminated
            options = self._uncancellable
        else:
            options = ort.RunOptions()
            cancellation.on_cancel(lambda: setattr(options, "terminate", True))
        try:
            if self._has_bf16:
                return self._run_ort_values(feeds, output_names, options)
            if self._bind_io:
                return self._run_io_binding(feeds, output_names, options)
            outputs: list[np.ndarray] = self._session.run(list(output_names), feeds, options)  # ORT ships no types
            return outputs
        except Exception as err:
            if options is not None and options.terminate:
                raise Cancelled("the execution was terminated: every request in it was cancelled") from None
            if isinstance(err, _VALUE_ERRORS):
                raise InvalidInput(_value_error(str(err), list(feeds))) from None
            raise

    def _run_io_binding(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                        options: ort.RunOptions | None) -> list[np.ndarray]:
        binding = self._session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in output_names:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding, options)
        outputs: list[np.ndarray] = binding.copy_outputs_to_cpu()
        return outputs

    def _run_ort_values(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                        options: ort.RunOptions | None) -> list[np.ndarray]:
        values = {}
        for name, array in feeds.items():
            array = np.ascontiguousarray(array)
            if array.dtype == BF16.numpy:
                values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    array.view(np.uint16), onnx_element_type=_BF16_ONNX_ELEMENT_TYPE
                )
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        results = self._session.run_with_ort_values(list(output_names), values, options)
        return [_from_ort_value(value) for value in results]



class OnnxModel:
    """The built-in backend: an ONNX graph whose tensors are the V2 interface, on its instances' sessions."""

    batchable = True
    threaded = False
    batching: BatchStrategy | None = None
    text: TextContract | None = None

    def __init__(self, sessions: Sequence[OnnxSession]) -> None:
        """``sessions``: one per instance (``open_sessions``), CPU instances sharing one. With a
        single session every execution runs on it; with several, each execution takes a free
        instance's session (the least recently used, so the GPUs take turns) and gives it back, and
        waits for one when all are busy (the version's instance pool runs at most as many at once)."""
        self._session = sessions[0]
        self.inputs, self.outputs = self._session.inputs, self._session.outputs
        self.on_cuda = any(session.on_cuda for session in sessions)
        self._free: SimpleQueue[OnnxSession] | None = None
        if any(session is not self._session for session in sessions):
            self._free = SimpleQueue()
            for session in sessions:
                self._free.put(session)

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: RequestContext = NO_CONTEXT) -> Execution:
        """``OnnxSession.run`` on an instance's session; request parameters and context do not concern the graph."""
        free = self._free
        if free is None:
            return Execution(self._session.run(feeds, output_names))
        session = free.get()
        try:
            return Execution(session.run(feeds, output_names))
        finally:
            free.put(session)

    def close(self) -> None:
        """Nothing to do: the sessions go with the last reference to the model."""


def open_onnx(model_dir: Path, version: int, config: mc.ModelConfig, host: BackendHost) -> OnnxModel:
    """Open ``<model_dir>/<version>/<default_model_filename>`` (a file, or a folder with model.onnx),
    after ``initialize`` with the onnxruntime settings of ``host``, the server that loads it.

    A configured file name must resolve (symlinks too) inside the model folder.

    Raises:
        FileNotFoundError: no model file; ValueError: a configured name leaving the folder, the
            global thread pools refused (``initialize``); anything ORT raises for an invalid model.
    """
    initialize(host.backend_config.onnxruntime)
    relative = Path(str(version), config.default_model_filename or "model.onnx")
    path = model_dir / relative
    if config.default_model_filename:
        path = confined_file(model_dir, relative, "default_model_filename", config.name)
    path = path / "model.onnx" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"model file '{relative}' not found")
    return OnnxModel(open_sessions(path, config))


def confined_file(model_dir: Path, relative: Path, where: str, name: str) -> Path:
    """``model_dir / relative`` with symlinks resolved, if it stays inside the (resolved) model folder.

    Raises:
        ValueError: the resolved path leaves the folder - the same message whether or not the
            target exists, naming the model and the rule, never a host path.
    """
    root = model_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"model '{name}': {where} must be a relative path inside the model folder")
    return path


BACKEND = Backend(open_onnx)

def _tensor(arg: ort.NodeArg, overridable: bool = False) -> TensorDeclaration:
    dtype = datatypes.BY_ONNX.get(arg.type)
    if dtype is None:
        raise ValueError(f"tensor '{arg.name}' has type {arg.type}, which the V2 protocol cannot carry")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorDeclaration(arg.name, dtype, shape, optional=overridable, overridable=overridable)


def _value_error(message: str, inputs: list[str]) -> str:
    """The client's message for a kernel failing on input values: the inputs it names (else every
    input of the request) and ORT's status message without its code prefix."""
    detail = message.rsplit("Status Message: ", 1)[-1].split(" : ")[-1].strip()
    named = [name for name in inputs if f"'{name}'" in message or name in detail.split()] or inputs
    return f"the model cannot compute on the values of input(s) {', '.join(repr(n) for n in named)}: {detail}"


def _as_text(array: np.ndarray, name: str) -> np.ndarray:
    text = np.empty(array.shape, dtype=object)
    flat_in, flat_out = array.reshape(-1), text.reshape(-1)
    for i, item in enumerate(flat_in):
        try:
            flat_out[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError:
            raise InvalidInput(
                f"element {i} of BYTES input '{name}' is not valid UTF-8: ONNX Runtime's Python API passes only "
                "UTF-8 text into string tensors (other bytes would be altered, not passed through)"
            ) from None
    return text


def _from_ort_value(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        array: np.ndarray = value.numpy()
        return array
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return np.frombuffer(raw, dtype=BF16.numpy).reshape(value.shape())
