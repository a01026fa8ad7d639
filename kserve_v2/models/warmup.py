"""Model warmup: Triton's ``model_warmup`` (``model_configuration.md``, "Model Warmup"; the core's
``TritonModelInstance::GenerateWarmupData`` and ``WarmUp``).

Before a version turns READY, each of its instances runs the configuration's samples in order, each
``count`` times (at least once): one execution of ``batch_size`` identical requests; a sample with
``batch_size: 0`` is skipped. A request's inputs are the sample's ``inputs``, each ``dims`` as given
(no wildcard), with a batch dim of 1 in front for a batching model (``max_batch_size > 0``), filled
with ``zero_data`` (zeros; BYTES: empty strings), ``random_data`` (random bytes; BYTES get zero data,
as Triton) or ``input_data_file``, a file of the model folder's ``warmup/`` subfolder holding the raw
little-endian bytes (its first bytes, as many as the shape needs; BYTES: the whole file, each element
after its 4-byte length). The requests are checked as a client's request is
(``kserve_v2.request.decode``), then executed on the instance without the scheduler; an input the
configuration does not declare (a sequence control input) goes to the backend as given. A backend
that answers several requests in one execution gets them as the dynamic batcher would give them
(``BatchStrategy.execute_batch``); a batch larger than ``max_batch_size`` (and than 1) is refused as
Triton's onnxruntime and python backends refuse it. Decoupled models answer on a stream each, waited
for until its final flag.

Warmup requests count in the version's statistics as Triton counts them (its core reports each warmup
request and execution like a client's): each request a success and an inference, each execution an
execution. The first failing sample fails the load; its reason is Triton's text (see ``WarmupError``).
The server's log gives each version's warmup time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Executable, Execution, Parameter, RequestContext, ResponseStream
from kserve_v2.codec.messages import Buffer, InferRequest, InputTensor, RequestHeader
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import BYTES, DType
from kserve_v2.protocol.errors import InternalError, ServerError
from kserve_v2.protocol.model_spec import ModelSpec
from kserve_v2.protocol.statistics import ModelStats, RequestReport
from kserve_v2.protocol.tensors import from_raw
from kserve_v2.request.decode import decode_request
from kserve_v2.scheduling.base import model_time
from kserve_v2.scheduling.dynamic_batcher import RowBatching
from kserve_v2.scheduling.instances import InstancePool

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"  # Triton's kWarmupDataFolder: input_data_file is relative to <model>/warmup/
# how Triton's core names a request without an id in its messages (InferenceRequest::LogRequest)
_NO_ID = "[request id: <id_unknown>] "
_STRING_PREFIX = 4  # bytes of a BYTES element's length prefix (Triton's serialized strings)


class WarmupError(ValueError):
    """A sample that cannot be built or fails to run; the message is the version's load failure reason
    (RepositoryIndex, the load call's error), with Triton's texts:

    - ``warmup setting expects all variable-size dimensions are specified for input '<i>'``;
    - ``[request id: <id_unknown>] warmup setting expects input '<i>' to have input_data_type set``;
    - ``[request id: <id_unknown>] warmup setting expects <n> bytes, but the data provided from <file>only has
      <m> bytes`` (Triton's text, its missing space included);
    - ``failed to open text file for read <path>: <reason>`` (the path shown from ``<model folder>`` on);
    - a request check's text after ``[request id: <id_unknown>] `` (``kserve_v2.request.decode``);
    - ``failed to run warmup sample '<sample>': <error>; `` with each failed request's error and ``; ``.
    """


@dataclass(frozen=True, slots=True)
class Sample:
    """One warmup sample, built: what each of its requests feeds the backend.

    Attributes:
        name: the sample's ``name``.
        count: executions per instance (the configured ``count``, at least 1).
        batch_size: identical requests in each execution (>= 1).
        feeds: input name -> array, one request's inputs as the backend takes them.
        output_names: the outputs asked for: every configured output.
    """

    name: str
    count: int
    batch_size: int
    feeds: dict[str, np.ndarray]
    output_names: tuple[str, ...]


def build_samples(config: mc.ModelConfig, spec: ModelSpec, model_dir: Path) -> list[Sample]:
    """The configuration's ``model_warmup`` samples as requests (see the module docstring), in order;
    ``batch_size: 0`` samples are left out.

    Raises:
        WarmupError: a sample that cannot be built (a wildcard dim, no data kind, a file that cannot be
            read or is too short, a request the model would refuse).
    """
    samples = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.debug("Skipping batch 0 warmup sample '%s'", setting.name)
            continue
        log.debug("Generating warmup sample data for '%s'", setting.name)
        try:
            samples.append(_sample(setting, config, spec, model_dir))
        except WarmupError as err:  # Triton's text does not name the sample: the log does
            log.error("model '%s': warmup sample '%s' cannot be built: %s", config.name, setting.name, err)
            raise
    return samples


def warm_up(pool: InstancePool, config: mc.ModelConfig, spec: ModelSpec, stats: ModelStats, model_dir: Path,
            version: int) -> None:
    """Run the configuration's warmup samples on each instance of ``pool`` (blocking, off the event loop;
    before the version is READY), counting them in ``stats``; logs the time it took.

    Raises:
        WarmupError: the first sample that cannot be built or fails (see ``WarmupError``).
    """
    started = time.perf_counter_ns()
    samples = build_samples(config, spec, model_dir)
    if not samples:
        return
    instance = f"{config.instance_group[0].name}_0" if config.instance_group else config.name
    for sample in samples:
        for iteration in range(1, sample.count + 1):
            log.debug("model '%s' version %d: %d instance(s) running warmup sample '%s' for iteration %d",
                      config.name, version, pool.count, sample.name, iteration)
            runs = pool.on_each(functools.partial(_execute, pool.executable, sample, config, instance))
            for run in runs:
                errors = _errors(run)
                if errors:
                    log.error("model '%s' version %d failed to run warmup sample '%s'", config.name, version,
                              sample.name)
                    raise WarmupError(f"failed to run warmup sample '{sample.name}': "
                                      + "".join(f"{error}; " for error in errors))
            for run in runs:
                _count(stats, run)
    log.info("model '%s' version %d warmed up in %.1f ms (%d sample(s) on %d instance(s))", config.name, version,
             (time.perf_counter_ns() - started) / 1e6, len(samples), pool.count)


# one execution of a sample: each request's outcome (its execution, or its error), the errors its
# requests' response streams carried (decoupled models), and the execution's start and end (ns)
_Shares = tuple[list[Execution | Exception], list[str], int, int]


def _execute(executable: Executable, sample: Sample, config: mc.ModelConfig, instance: str) -> _Shares:
    """One execution of ``sample`` on the calling instance thread."""
    started = time.perf_counter_ns()
    size, limit = sample.batch_size, config.max_batch_size
    if size != 1 and size > limit:  # Triton's backends refuse it (python_be.cc, onnxruntime.cc)
        refused = InternalError(f"batch size {size} for '{instance}', max allowed is {limit}")
        return [refused] * size, [], started, time.perf_counter_ns()
    decoupled = config.model_transaction_policy.decoupled
    streams = [_Stream() if decoupled else None for _ in range(size)]
    contexts = [RequestContext(responses=stream) for stream in streams]
    shares: list[Execution | Exception]
    try:
        if size == 1:
            shares = [executable.execute(sample.feeds, sample.output_names, {}, contexts[0])]
        else:
            strategy = executable.batching or RowBatching(executable)
            shares = strategy.execute_batch([sample.feeds] * size, sample.output_names, {}, contexts)
    except Exception as err:  # noqa: BLE001 - the execution's requests fail with its error
        shares = [err] * size
    sent = [error for stream in streams if stream is not None and stream.taken for error in stream.wait()]
    return shares, sent, started, time.perf_counter_ns()


def _errors(run: _Shares) -> list[str]:
    """The messages of an execution's failed requests and of the error responses they were sent."""
    shares, sent, _, _ = run
    return [str(share) for share in shares if isinstance(share, Exception)] + sent


def _count(stats: ModelStats, run: _Shares) -> None:
    """Each request of one successful execution as a success (a batch of ``len(shares)``, 1 row each)."""
    shares, _, started, finished = run
    for i, share in enumerate(shares):
        assert isinstance(share, Execution)
        stats.record_success(RequestReport(1, int(i == 0), len(shares), finished - started, 0, share.pre_ns,
                                           model_time(share, started, finished), share.post_ns))


class _Stream(ResponseStream):
    """A warmup request's responses from a decoupled model: only their errors are kept (Triton's warmup
    reads nothing else), and ``wait`` returns once the final flag is sent."""

    def __init__(self) -> None:
        loop = asyncio.new_event_loop()
        loop.close()  # nothing reads the queue: a closed loop makes ``send`` deliver nothing
        super().__init__(loop)
        self._errors: list[str] = []
        self._final = threading.Event()

    def send(self, outputs: dict[str, np.ndarray] | None, error: ServerError | None = None, final: bool = False,
             parameters: dict[str, Parameter] | None = None) -> None:
        """Keep the response's error; see ``ResponseStream.send``."""
        super().send(outputs, error, final, parameters)
        if error is not None:
            self._errors.append(str(error))
        if final:
            self._final.set()

    def wait(self) -> list[str]:
        """The errors of the request's responses, once its final flag is sent (blocking)."""
        self._final.wait()
        return self._errors


def _sample(setting: mc.ModelWarmup, config: mc.ModelConfig, spec: ModelSpec, model_dir: Path) -> Sample:
    """One sample's request (see ``build_samples``)."""
    sizes = {}
    for name, meta in setting.inputs.items():  # first pass, as Triton's: every shape is known
        sizes[name] = _byte_size(name, meta)
    inputs: list[InputTensor] = []
    raw: list[Buffer] = []
    extra: dict[str, np.ndarray] = {}
    for name, meta in setting.inputs.items():
        dtype = _dtype(name, meta)
        data = _data(name, meta, dtype, sizes[name], model_dir)
        declared = name in spec.inputs_by_name
        shape = ([1] if config.max_batch_size > 0 and declared else []) + list(meta.dims)
        if declared:
            inputs.append(InputTensor(name, dtype.v2, shape))
            raw.append(data)
        else:  # not a model input (a control input): the backend gets it as given
            try:
                extra[name] = from_raw(data, dtype, shape, f"input '{name}'")
            except ServerError as err:
                raise WarmupError(f"{_NO_ID}{err}") from None
    try:
        decoded = decode_request(InferRequest(RequestHeader(config.name, "", {}, inputs, []), "", raw), spec)
    except ServerError as err:
        raise WarmupError(f"{_NO_ID}{err}") from None
    feeds = {**decoded.feeds, **extra}
    return Sample(setting.name, max(setting.count, 1), setting.batch_size, feeds, tuple(decoded.output_names))


def _dtype(name: str, meta: mc.ModelWarmup.Input) -> DType:
    found = datatypes.BY_CONFIG.get(mc.DataType.Name(meta.data_type))
    if found is None:
        raise WarmupError(f"{_NO_ID}warmup setting expects input '{name}' to have a valid data_type")
    return found


def _byte_size(name: str, meta: mc.ModelWarmup.Input) -> int:
    """The bytes of one request's ``name`` (Triton's ``GetByteSize``: BYTES count 4 per element)."""
    dims = list(meta.dims)
    if any(d < -1 for d in dims):
        raise WarmupError(f"tensor '{name}' contains an invalid dimension {_dims_text(dims)}")
    if -1 in dims:
        raise WarmupError("warmup setting expects all variable-size dimensions are specified for input "
                          f"'{name}'")
    dtype = _dtype(name, meta)
    return math.prod(dims) * (_STRING_PREFIX if dtype is BYTES else dtype.itemsize)


def _data(name: str, meta: mc.ModelWarmup.Input, dtype: DType, size: int, model_dir: Path) -> bytes:
    """One request's raw bytes of input ``name``."""
    kind = meta.WhichOneof("input_data_type")
    if kind == "zero_data" or (kind == "random_data" and dtype is BYTES):
        return bytes(size)
    if kind == "random_data":
        return os.urandom(size)
    if kind != "input_data_file":
        raise WarmupError(f"{_NO_ID}warmup setting expects input '{name}' to have input_data_type set")
    path = _confined(model_dir, meta.input_data_file)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise WarmupError(f"failed to open text file for read {path}: {err.strerror or type(err).__name__}") from None
    if dtype is BYTES:
        return data
    if size > len(data):
        raise WarmupError(f"{_NO_ID}warmup setting expects {size} bytes, but the data provided from "
                          f"{meta.input_data_file}only has {len(data)} bytes")
    return data[:size]


def _confined(model_dir: Path, relative: str) -> Path:
    """``<model_dir>/warmup/<relative>`` with symlinks resolved, if it stays inside the model folder
    (the configuration's paths are checked when it is read; a link may still point out).

    Raises:
        WarmupError: the resolved path leaves the folder (the message never shows the path).
    """
    root = model_dir.resolve()
    path = (root / WARMUP_FOLDER / relative).resolve()
    if not path.is_relative_to(root):
        raise WarmupError(f"model '{model_dir.name}': input_data_file must be a relative path inside the model folder")
    return path


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
