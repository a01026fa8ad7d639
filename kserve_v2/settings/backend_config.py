"""``--backend-config=<backend>,<setting>=<value>`` and ``--backend-config=<setting>=<value>``
(Triton's ``tritonserver`` flag, repeatable): the settings of a backend, or of every backend.

- ``python``: the shared memory settings and ``stub-timeout-seconds``, as Triton's python backend
  names and checks them (its README, "Managing Shared Memory"); they apply to models run in stub
  processes (``kserve_v2.runtime.python.process``). ``execution-mode`` (ours: Triton runs every
  python model in a stub) is where a python model runs when its configuration has no
  ``EXECUTION_MODE`` parameter.
- ``onnxruntime``: Triton's onnxruntime backend's command line options (its README, "Command line
  options"): ``enable-global-threadpool`` with the global pools' ``intra_op_thread_count`` and
  ``inter_op_thread_count`` (``kserve_v2.runtime.onnx.initialize`` acts on them), and
  ``default-max-batch-size``.
- no backend named: ``default-max-batch-size``, the ``max_batch_size`` auto-complete gives a model
  that can batch (Triton core's backend setting, default 4, given to every backend; a backend's own
  value overrides it).

Any other backend or setting is refused, naming it and the supported ones; a value that is not of
its setting's kind is refused, naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PYTHON = "python"
ONNXRUNTIME = "onnxruntime"
PYTHON_SETTINGS = ("shm-default-byte-size", "shm-growth-byte-size", "stub-timeout-seconds", "shm-region-prefix-name",
                   "execution-mode")
ONNXRUNTIME_SETTINGS = ("enable-global-threadpool", "intra_op_thread_count", "inter_op_thread_count",
                        "default-max-batch-size")
GLOBAL_SETTINGS = ("default-max-batch-size",)
DEFAULT_MAX_BATCH_SIZE = 4  # Triton core's default-max-batch-size (backend_model.cc, backend_config_defaults)
EXECUTION_MODES = ("in_process", "process")
# what each backend (and "": every backend) accepts
_SUPPORTED = {PYTHON: PYTHON_SETTINGS, ONNXRUNTIME: ONNXRUNTIME_SETTINGS, "": GLOBAL_SETTINGS}
# Triton's backends' ParseBoolValue spellings (backend_common.cc), lower-cased
_BOOLEANS = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}


@dataclass(frozen=True, slots=True)
class PythonBackendConfig:
    """The python backend's settings (Triton's defaults: 1 MiB regions growing by 1 MiB).

    Attributes:
        shm_default_byte_size: a region's first size, bytes (``shm-default-byte-size``, at least 1 MiB).
        shm_growth_byte_size: the step a region grows by, bytes (``shm-growth-byte-size``, > 0).
        shm_region_prefix_name: the start of a region's name in ``/dev/shm`` (``shm-region-prefix-name``).
        stub_timeout_seconds: how long the server waits for a stub process to answer a call (an
            ``execute`` included) before it kills it as not healthy, seconds (``stub-timeout-seconds``,
            > 0; Triton's default 30).
        execution_mode: where a python model whose configuration has no ``EXECUTION_MODE`` runs:
            ``in_process`` (the default) or ``process`` (``execution-mode``).
    """

    shm_default_byte_size: int = 1 << 20
    shm_growth_byte_size: int = 1 << 20
    shm_region_prefix_name: str = "triton_python_backend_shm_region_"
    stub_timeout_seconds: int = 30
    execution_mode: str = "in_process"


@dataclass(frozen=True, slots=True)
class OnnxRuntimeBackendConfig:
    """The onnxruntime backend's settings (Triton's onnxruntime backend README, "Command line options").

    Attributes:
        enable_global_threadpool: every ONNX Runtime session of the process runs on one pair of
            global thread pools instead of pools of its own (``enable-global-threadpool``, Triton's
            boolean spellings ``1``/``true``/``on``, ``0``/``false``/``off``); a model's
            ``intra_op_thread_count`` and ``inter_op_thread_count`` parameters then have no effect.
        intra_op_thread_count: the global intra-op pool's threads (``intra_op_thread_count``, >= 0;
            0: ONNX Runtime's default, one per physical core). As in Triton, only with
            ``enable_global_threadpool``.
        inter_op_thread_count: the global inter-op pool's threads (``inter_op_thread_count``, >= 0;
            0: ONNX Runtime's default). As in Triton, only with ``enable_global_threadpool``.
        default_max_batch_size: the ``max_batch_size`` auto-complete gives an onnxruntime model that
            can batch (``onnxruntime,default-max-batch-size``, else the one given to every backend;
            >= 0, Triton's default 4; 0: auto-complete turns batching off).
    """

    enable_global_threadpool: bool = False
    intra_op_thread_count: int = 0
    inter_op_thread_count: int = 0
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """Every backend's settings from ``--backend-config``.

    Attributes:
        python: the python backend's (``python,<setting>=<value>``).
        onnxruntime: the onnxruntime backend's (``onnxruntime,<setting>=<value>``).
        default_max_batch_size: the ``max_batch_size`` auto-complete gives a model of another backend
            that can batch (``default-max-batch-size=<n>`` with no backend named; Triton's default 4).
    """

    python: PythonBackendConfig = PythonBackendConfig()
    onnxruntime: OnnxRuntimeBackendConfig = OnnxRuntimeBackendConfig()
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE

    def default_max_batch_size_of(self, backend: str) -> int:
        """The ``max_batch_size`` auto-complete gives a model of ``backend`` (a ``config.pbtxt``
        ``backend`` name) that can batch: the backend's own ``default-max-batch-size``, else the one
        given to every backend (Triton core's ``TritonModel::ResolveBackendConfigs``)."""
        return self.onnxruntime.default_max_batch_size if backend == ONNXRUNTIME else self.default_max_batch_size


def parse_backend_config(values: Sequence[str]) -> BackendConfig:
    """Every backend's settings from ``--backend-config`` values: ``<backend>,<setting>=<value>``,
    or ``<setting>=<value>`` for every backend (Triton's ``ParseBackendConfigOption``, tritonserver
    ``command_line_parser.cc``).

    Raises:
        ValueError: a value in neither form (Triton's texts); a backend other than ``python`` and
            ``onnxruntime``; a setting its backend does not support (naming it and the supported
            ones); the python backend's checks (``_python``); an onnxruntime or global value that is
            not of its setting's kind (naming the setting and the value).
    """
    given: dict[str, dict[str, str]] = {}  # by backend ("": every backend's), the last of a setting winning
    for value in values:
        head, comma, rest = value.partition(",")
        if not comma or "=" in head:  # "<setting>=<value>": every backend's
            head, rest = "", value
        elif not head:
            raise ValueError("No backend specified. --backend-config option format is <backend name>,<setting>=<value> "
                             f"or <setting>=<value>. Got {value}")
        key, equals, setting = rest.partition("=")
        if not equals or not key:
            raise ValueError(f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {value}")
        if head not in _SUPPORTED:
            raise ValueError(f"--backend-config: backend '{head}' has no settings here (only "
                             f"{'; '.join(f'{b!r} has: ' + ', '.join(s) for b, s in _SUPPORTED.items() if b)})")
        if key not in _SUPPORTED[head]:
            where = f"{head} setting '{key}'" if head else f"setting '{key}' (no backend named: every backend's)"
            raise ValueError(f"--backend-config: {where} is not supported (supported: "
                             f"{', '.join(_SUPPORTED[head])})")
        given.setdefault(head, {})[key] = setting
    every = _count(given.get("", {}), "default-max-batch-size", "", DEFAULT_MAX_BATCH_SIZE)
    return BackendConfig(_python(given.get(PYTHON, {})), _onnxruntime(given.get(ONNXRUNTIME, {}), every), every)


def _onnxruntime(found: dict[str, str], default_max_batch_size: int) -> OnnxRuntimeBackendConfig:
    """The onnxruntime backend's settings given (``default_max_batch_size``: every backend's).

    Raises:
        ValueError: ``enable-global-threadpool`` not one of Triton's boolean spellings; a thread count
            or ``default-max-batch-size`` that is not an integer >= 0.
    """
    enable = found.get("enable-global-threadpool", "0")
    if enable.lower() not in _BOOLEANS:
        raise ValueError(f"--backend-config: onnxruntime setting 'enable-global-threadpool' must be a boolean "
                         f"({', '.join(_BOOLEANS)}), got '{enable}'")
    return OnnxRuntimeBackendConfig(_BOOLEANS[enable.lower()],
                                    _count(found, "intra_op_thread_count", ONNXRUNTIME, 0),
                                    _count(found, "inter_op_thread_count", ONNXRUNTIME, 0),
                                    _count(found, "default-max-batch-size", ONNXRUNTIME, default_max_batch_size))


def _count(found: dict[str, str], key: str, backend: str, default: int) -> int:
    """Setting ``key`` of ``backend`` ("": every backend's) as an integer >= 0, ``default`` when not given.

    Raises:
        ValueError: a value that is not an integer >= 0, naming the setting and the value.
    """
    if key not in found:
        return default
    text = found[key]
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        where = f"{backend} setting" if backend else "setting"
        raise ValueError(f"--backend-config: {where} '{key}' must be an integer >= 0, got '{text}'")
    return count


def _python(found: dict[str, str]) -> PythonBackendConfig:
    """The python backend's settings given.

    Raises:
        ValueError: Triton's texts for a size that is not an integer, a default size under 1 MiB
            ("shm-default-byte-size can't be smaller than 4 MiBs", sic), a growth size <= 0, a stub
            timeout <= 0 ("stub-timeout-seconds can't be smaller than or equal to zero."), an empty
            prefix; a prefix with '/'; an execution mode other than ``EXECUTION_MODES``.
    """
    sizes = {}
    for key in PYTHON_SETTINGS[:3]:
        if key in found:
            try:
                sizes[key] = int(found[key])
            except ValueError:
                raise ValueError(f"--backend-config: python setting '{key}' must be an integer, got "
                                 f"'{found[key]}'") from None
    default = PythonBackendConfig()
    config = PythonBackendConfig(sizes.get("shm-default-byte-size", default.shm_default_byte_size),
                                 sizes.get("shm-growth-byte-size", default.shm_growth_byte_size),
                                 found.get("shm-region-prefix-name", default.shm_region_prefix_name),
                                 sizes.get("stub-timeout-seconds", default.stub_timeout_seconds),
                                 found.get("execution-mode", default.execution_mode))
    if config.shm_default_byte_size < 1 << 20:
        raise ValueError("shm-default-byte-size can't be smaller than 4 MiBs")
    if config.shm_growth_byte_size <= 0:
        raise ValueError("shm-growth-byte-size can't be smaller than or equal to zero.")
    if config.stub_timeout_seconds <= 0:
        raise ValueError("stub-timeout-seconds can't be smaller than or equal to zero.")
    if config.execution_mode not in EXECUTION_MODES:
        raise ValueError(f"--backend-config: python setting 'execution-mode' must be one of "
                         f"{', '.join(repr(m) for m in EXECUTION_MODES)}, not {config.execution_mode!r}")
    if not config.shm_region_prefix_name:
        raise ValueError("shm-region-prefix-name must at least contain one character.")
    if "/" in config.shm_region_prefix_name:
        raise ValueError("--backend-config: python setting 'shm-region-prefix-name' cannot contain '/'")
    return config
