"""The built-in ``python`` backend: Triton python-backend models run unchanged, in the server's
own process (Triton's "Python Backend" documentation; no stub process, no shared memory).

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
calls ``finalize``. ``EXECUTION_ENV_PATH`` and custom stubs are refused at load: models run in the
server's interpreter.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types
from pathlib import Path
from typing import Any

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend
from kserve_v2.runtime.onnx import confined_file
from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.config import ModelConfig, complete, config_json
from kserve_v2.runtime.python.model import PythonModel, running_as, text_of
from kserve_v2.runtime.python.pb_utils import Running

# model.py imports it by Triton's name
sys.modules.setdefault("triton_python_backend_utils", pb_utils)
# what model code finds in sys.argv: Triton's stub runs an embedded interpreter given no arguments
STUB_ARGV = [""]

MODEL_FILE = "model.py"
CUSTOM_STUB = "triton_python_backend_stub"
_loaded = itertools.count()


def open_python(model_dir: Path, version: int, config: mc.ModelConfig) -> PythonModel:
    """Load ``<model_dir>/<version>/model.py``, auto-complete ``config`` (in place) and initialize
    the instances.

    Raises:
        ValueError: ``EXECUTION_ENV_PATH`` or a custom stub; a file that fails to import or has no
            ``TritonPythonModel``; an ``auto_complete_config`` or ``initialize`` that raises (the
            message names the model, the step and the exception).
        FileNotFoundError: no model file.
    """
    if "EXECUTION_ENV_PATH" in config.parameters:
        raise ValueError(f"model '{config.name}': EXECUTION_ENV_PATH (a packed Python environment) is not supported: "
                         "python models run in the server's own interpreter; install their packages there")
    if (model_dir / CUSTOM_STUB).exists():
        raise ValueError(f"model '{config.name}': a custom python backend stub is not supported: python models run in "
                         "the server's own interpreter")
    relative = Path(str(version), config.default_model_filename or MODEL_FILE)
    path = confined_file(model_dir, relative, "default_model_filename", config.name)
    if not path.is_file():
        raise FileNotFoundError(f"model file '{relative}' not found")
    sys.argv = list(STUB_ARGV)  # model code (unittest.main, argparse) never sees the server's command line
    model_class = _model_class(path, config.name)
    folder = str(path.parent)
    if hasattr(model_class, "auto_complete_config"):
        with running_as(Running(folder, None, ())):
            try:
                completed = model_class.auto_complete_config(ModelConfig(config_json(config)))
            except (Exception, SystemExit) as err:  # noqa: BLE001 - the load failure reason
                raise ValueError(f"auto_complete_config of python model '{config.name}' failed: {text_of(err)}") from None
        complete(config, completed)
    return PythonModel(model_class, config, model_dir, version, folder)


def _model_class(path: Path, name: str) -> Any:
    """Import the model file as the module ``model`` of a package that is its version folder (as
    Triton's stub imports ``<version>.model``, so ``from . import helper`` finds the folder's
    ``helper.py``; the folder is on ``sys.path`` too, for ``import helper``) and return its
    ``TritonPythonModel``."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)  # sibling modules import as in Triton's stub
    package = types.ModuleType(f"_kserve_v2_python_model_{next(_loaded)}")
    package.__path__ = [folder]
    package.__package__ = package.__name__
    sys.modules[package.__name__] = package
    spec = importlib.util.spec_from_file_location(f"{package.__name__}.{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"python model '{name}': its model file cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    setattr(package, path.stem, module)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the load failure reason
        sys.modules.pop(spec.name, None)
        sys.modules.pop(package.__name__, None)
        raise ValueError(f"python model '{name}': importing its model file failed: {text_of(err)}") from None
    model_class = getattr(module, "TritonPythonModel", None)
    if not isinstance(model_class, type):
        raise ValueError(f"python model '{name}': its model file defines no class TritonPythonModel")
    return model_class


BACKEND = Backend(open_python)
