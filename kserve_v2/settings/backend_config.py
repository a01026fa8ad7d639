"""``--backend-config=<backend>,<setting>=<value>`` (Triton's ``tritonserver`` flag, repeatable): the
settings of a backend. The ``python`` backend's shared memory settings and ``stub-timeout-seconds``
are read, as Triton's python backend names and checks them (its README, "Managing Shared Memory");
they apply to models run in stub processes (``kserve_v2.runtime.python.process``). ``execution-mode``
(ours: Triton runs every python model in a stub) is where a python model runs when its configuration
has no ``EXECUTION_MODE`` parameter. Any other backend or setting is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PYTHON_SETTINGS = ("shm-default-byte-size", "shm-growth-byte-size", "stub-timeout-seconds", "shm-region-prefix-name",
                   "execution-mode")
EXECUTION_MODES = ("in_process", "process")


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


def parse_backend_config(values: Sequence[str]) -> PythonBackendConfig:
    """The python backend's settings from ``--backend-config`` values (``python,<setting>=<value>``).

    Raises:
        ValueError: a value not in that form; a backend other than ``python``; a python setting
            other than ``PYTHON_SETTINGS``; Triton's texts for a size that is not an integer, a
            default size under 1 MiB ("shm-default-byte-size can't be smaller than 4 MiBs", sic), a
            growth size <= 0, a stub timeout <= 0 ("stub-timeout-seconds can't be smaller than or
            equal to zero."), an empty prefix; an execution mode other than ``EXECUTION_MODES``.
    """
    found: dict[str, str] = {}
    for value in values:
        backend, comma, setting = value.partition(",")
        key, equals, given = setting.partition("=")
        if not comma or not equals or not backend or not key:
            raise ValueError(f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {value}")
        if backend != "python":
            raise ValueError(f"--backend-config: backend '{backend}' has no settings here (only 'python' has: "
                             f"{', '.join(PYTHON_SETTINGS)})")
        if key not in PYTHON_SETTINGS:
            raise ValueError(f"--backend-config: python setting '{key}' is not supported (supported: "
                             f"{', '.join(PYTHON_SETTINGS)})")
        found[key] = given
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
