"""The built-in ``python`` backend: Triton python-backend models run unchanged, in the server's
own process by default (Triton's "Python Backend" documentation), or in stub processes (below).

A version is ``<version>/model.py`` (or ``default_model_filename``) defining ``TritonPythonModel``.
Loading imports it as the module ``model`` of a package that is the version folder (as Triton's stub
imports ``<version>.model``: ``from . import helper`` works; the folder joins ``sys.path`` too, as
Triton's stub adds it), runs the static ``auto_complete_config`` on the configuration (``config``),
and makes one object per instance of the instance group, each ``initialize``d with Triton's ``args``
(``model``, which runs the version: its ``PythonModel``). Model code finds ``sys.argv == [""]``, as
in Triton's stub (an embedded interpreter given no arguments), never the server's command line.
``execute`` gets the requests of one execution (one, or the dynamic batcher's batch) as
``pb_utils.InferenceRequest``s on the instance's thread, never on the event loop (``threaded``); an
``async def execute`` runs on the instance's own event loop, which runs on a thread of its own while
the version is loaded (a decoupled model's executes overlap there). A decoupled model sends its
responses through each request's sender to the request's ``ResponseStream``
(``kserve_v2.backend.decoupled``). An exception in ``execute`` (``SystemExit`` included) fails that
execution's requests with Triton's text, "Failed to process the request(s) for model '<instance>',
message: <type>: <message>", and the model goes on serving; in loading it fails the load. Unloading
calls ``finalize``. Custom stubs are refused at load.

With the configuration parameter ``EXECUTION_MODE`` set to ``process`` (without it, the server's
``--backend-config=python,execution-mode=...``, ``in_process`` unless set; another value fails the
load), the model file is imported, auto-completed, initialized and
executed in a stub process per instance instead (``kserve_v2.runtime.python.process``), as Triton
runs every python model: a crash there fails only that instance's requests, and ``execute`` holds
no GIL of the server's. ``EXECUTION_ENV_PATH`` (a packed environment, or an environment folder)
implies it: the environment's interpreter runs the stub processes
(``kserve_v2.runtime.python.environments``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend, BackendHost
from kserve_v2.runtime.onnx import confined_file
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import ModelConfig, complete, config_json
from kserve_v2.runtime.python.executing import import_model_class, package_of, running_as, text_of
from kserve_v2.runtime.python.in_process import InProcessHost
from kserve_v2.runtime.python.model import PythonModel
from kserve_v2.runtime.python.environments import PARAMETER, open_environment
from kserve_v2.runtime.python.process import ProcessModel

log = logging.getLogger(__name__)
# model.py imports it by Triton's name
sys.modules.setdefault("triton_python_backend_utils", pb_utils)
# what model code finds in sys.argv: Triton's stub runs an embedded interpreter given no arguments
STUB_ARGV = [""]

MODEL_FILE = "model.py"
EXECUTION_MODE = "EXECUTION_MODE"
# Triton's python backend parameter: "yes" (its default) gives inputs in CPU memory, "no" lets them stay on a GPU
FORCE_CPU_ONLY_INPUT_TENSORS = "FORCE_CPU_ONLY_INPUT_TENSORS"
IN_PROCESS, PROCESS = "in_process", "process"
MODES = (IN_PROCESS, PROCESS)
CUSTOM_STUB = "triton_python_backend_stub"


def open_python(model_dir: Path, version: int, config: mc.ModelConfig, host: BackendHost) -> PythonModel:
    """Load ``<model_dir>/<version>/model.py``, auto-complete ``config`` (in place) and initialize
    the instances, for the server ``host`` (its custom metrics, calls and python backend settings).

    Raises:
        ValueError: a custom stub; an ``EXECUTION_ENV_PATH`` that cannot be used (``open_environment``),
            or with ``EXECUTION_MODE`` ``in_process``; a file that fails to import or has no
            ``TritonPythonModel``; an ``auto_complete_config`` or ``initialize`` that raises (the
            message names the model, the step and the exception).
        FileNotFoundError: no model file.
    """
    if (model_dir / CUSTOM_STUB).exists():
        raise ValueError(f"model '{config.name}': a custom python backend stub is not supported: the stub is this "
                         "server's own (kserve_v2.runtime.python.stub)")
    in_process = execution_mode(config, host.backend_config.python.execution_mode) == IN_PROCESS
    force_cpu = config.parameters.get(FORCE_CPU_ONLY_INPUT_TENSORS)
    if force_cpu is not None and force_cpu.string_value.lower() == "no":
        log.warning("model '%s': %s 'no' has no effect: this server's python backend gives models their input "
                    "tensors in CPU memory only", config.name, FORCE_CPU_ONLY_INPUT_TENSORS)
    environment = None
    if PARAMETER in config.parameters:  # a packed environment: its interpreter runs the stub processes
        if in_process and EXECUTION_MODE in config.parameters:
            raise ValueError(f"model '{config.name}': {PARAMETER} runs the model in stub processes, which "
                             f"{EXECUTION_MODE} 'in_process' refuses")
        environment, in_process = open_environment(config.parameters[PARAMETER].string_value, model_dir), False
    relative = Path(str(version), config.default_model_filename or MODEL_FILE)
    path = confined_file(model_dir, relative, "default_model_filename", config.name)
    if not path.is_file():
        raise FileNotFoundError(f"model file '{relative}' not found")
    if not in_process:
        model = ProcessModel(path, config.name, host, environment)
        try:
            return _opened(model, model.completes, path, model_dir, version, config, host, None)
        finally:
            model.discard()
    sys.argv = list(STUB_ARGV)  # model code (unittest.main, argparse) never sees the server's command line
    model_class = import_model_class(path, config.name)
    return _opened(model_class, hasattr(model_class, "auto_complete_config"), path, model_dir, version, config, host,
                   package_of(model_class))


def execution_mode(config: mc.ModelConfig, default: str) -> str:
    """Where the model's code runs: its ``EXECUTION_MODE`` parameter, else the server's ``default``
    (``--backend-config=python,execution-mode=...``, ``in_process`` unless set).

    Raises:
        ValueError: another value (the load fails, naming the key and the values).
    """
    parameter = config.parameters.get(EXECUTION_MODE)
    mode = parameter.string_value if parameter is not None else default
    if mode not in MODES:
        raise ValueError(f"model '{config.name}': parameter {EXECUTION_MODE} must be one of "
                         f"{', '.join(repr(m) for m in MODES)}, not {mode!r}")
    return mode


def _opened(model_class: Any, completes: bool, path: Path, model_dir: Path, version: int,
            config: mc.ModelConfig, host: BackendHost, package: str | None) -> PythonModel:
    """Auto-complete ``config`` with ``model_class`` (when ``completes``, unless the server runs with
    ``--disable-auto-complete-config``) and initialize its instances (``package``: what the model
    file was imported as, in process)."""
    folder = str(path.parent)
    if completes and host.model_load.auto_complete:  # --disable-auto-complete-config: Triton's stub skips it too
        with running_as(InProcessHost(folder, None, (), host=host)):
            try:
                completed = model_class.auto_complete_config(ModelConfig(config_json(config)))
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the load failure reason
                raise ValueError(f"auto_complete_config of python model '{config.name}' failed: {text_of(err)}") from None
        complete(config, completed)
    return PythonModel(model_class, config, model_dir, version, folder, host, package)


BACKEND = Backend(open_python)
