"""``--backend-config=<backend>,<setting>=<value>`` (Triton's ``tritonserver`` flag, repeatable): the
settings of a backend. The ``python`` backend's shared memory settings are read, as Triton's python
backend names and checks them (its README, "Managing Shared Memory"); they size the regions of
models run with ``EXECUTION_MODE`` ``process`` (``kserve_v2.runtime.python.process``). Any other
backend or setting is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PYTHON_SETTINGS = ("shm-default-byte-size", "shm-growth-byte-size", "shm-region-prefix-name")


@dataclass(frozen=True, slots=True)
class PythonBackendConfig:
    """The python backend's settings (Triton's defaults: 1 MiB regions growing by 1 MiB).

    Attributes:
        shm_default_byte_size: a region's first size, bytes (``shm-default-byte-size``, at least 1 MiB).
        shm_growth_byte_size: the step a region grows by, bytes (``shm-growth-byte-size``, > 0).
        shm_region_prefix_name: the start of a region's name in ``/dev/shm`` (``shm-region-prefix-name``).
    """

    shm_default_byte_size: int = 1 << 20
    shm_growth_byte_size: int = 1 << 20
    shm_region_prefix_name: str = "triton_python_backend_shm_region_"


def parse_backend_config(values: Sequence[str]) -> PythonBackendConfig:
    """The python backend's settings from ``--backend-config`` values (``python,<setting>=<value>``).

    Raises:
        ValueError: a value not in that form; a backend other than ``python``; a python setting
            other than ``PYTHON_SETTINGS``; Triton's texts for a size that is not an integer, a
            default size under 1 MiB ("shm-default-byte-size can't be smaller than 4 MiBs", sic), a
            growth size <= 0, an empty prefix.
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
    for key in PYTHON_SETTINGS[:2]:
        if key in found:
            try:
                sizes[key] = int(found[key])
            except ValueError:
                raise ValueError(f"--backend-config: python setting '{key}' must be an integer, got "
                                 f"'{found[key]}'") from None
    default = PythonBackendConfig()
    config = PythonBackendConfig(sizes.get("shm-default-byte-size", default.shm_default_byte_size),
                                 sizes.get("shm-growth-byte-size", default.shm_growth_byte_size),
                                 found.get("shm-region-prefix-name", default.shm_region_prefix_name))
    if config.shm_default_byte_size < 1 << 20:
        raise ValueError("shm-default-byte-size can't be smaller than 4 MiBs")
    if config.shm_growth_byte_size <= 0:
        raise ValueError("shm-growth-byte-size can't be smaller than or equal to zero.")
    if not config.shm_region_prefix_name:
        raise ValueError("shm-region-prefix-name must at least contain one character.")
    if "/" in config.shm_region_prefix_name:
        raise ValueError("--backend-config: python setting 'shm-region-prefix-name' cannot contain '/'")
    return config
