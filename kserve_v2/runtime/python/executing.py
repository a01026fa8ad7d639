"""What running model code takes on either side of the host seam, in the server's process and in a
stub process alike: importing ``model.py`` as Triton's stub does, the text an exception of model
code is reported with, running model code as a ``pb_utils.ModelHost``, the instance's event loop for
``async def execute``, and the checks of what ``execute`` returned (Triton's texts).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kserve_v2.runtime.python import pb_utils
from kserve_v2.runtime.python.tensors import InferenceResponse, TritonModelException

_loaded = itertools.count()


class ModelCodeError(Exception):
    """An exception model code raised in another process (``EXECUTION_MODE`` ``process``), as that
    process reported it: ``text`` is its ``text_of`` there."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class InstanceFailure(Exception):
    """An instance could not run an execution at all (its stub process died): the message is the
    requests' whole error text (Triton's "Failed to process the request(s) for model instance ...")."""


class Exited(Exception):
    """A ``SystemExit`` that model code raised on its instance's event loop, which must go on running."""


def text_of(err: BaseException) -> str:
    """An exception as model code's errors are reported: its type and message (never a traceback)."""
    if isinstance(err, ModelCodeError):
        return err.text
    if isinstance(err, Exited) and isinstance(err.__cause__, SystemExit):
        err = err.__cause__
    return f"{type(err).__name__}: {err}"


def import_model_class(path: Path, name: str) -> Any:
    """Import the model file as the module ``model`` of a package that is its version folder (as
    Triton's stub imports ``<version>.model``, so ``from . import helper`` finds the folder's
    ``helper.py``; the folder is on ``sys.path`` too, for ``import helper``) and return its
    ``TritonPythonModel``. Each import is a package of its own (``package_of`` names it), which is
    how ``pb_utils`` tells which model a thread the model started belongs to.

    Raises:
        ValueError: the file fails to import, or defines no class ``TritonPythonModel``.
    """
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


def package_of(model_class: Any) -> str:
    """The package ``import_model_class`` imported ``model_class``'s file as."""
    return str(model_class.__module__).partition(".")[0]


@contextmanager
def running_as(host: pb_utils.ModelHost) -> Iterator[None]:
    """Model code runs as ``host`` (``pb_utils.get_model_dir``, its BLS calls) within the block."""
    token = pb_utils.RUNNING.set(host)
    try:
        yield
    finally:
        pb_utils.RUNNING.reset(token)


async def awaited_as(host: pb_utils.ModelHost, coroutine: Any) -> Any:
    """``coroutine`` awaited as model code running as ``host`` (in its task's context, and the tasks it starts).

    Raises:
        Exited: it raised ``SystemExit``, which would stop the loop: it fails the execution instead.
    """
    pb_utils.RUNNING.set(host)
    try:
        return await coroutine
    except SystemExit as err:
        raise Exited(str(err)) from err


def serve_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Run an instance's event loop (for ``async def execute``) until it is stopped."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def check_returned(returned: Any, again: Sequence[bool]) -> None:
    """What a model answered once returns from ``execute``: a list with a response per request, None
    for each request it rescheduled (``again``).

    Raises:
        TritonModelException: Triton's texts for anything else (python_backend's ``pb_stub.cc``).
    """
    count = len(again)
    if not isinstance(returned, list):
        raise TritonModelException(f"Expected a list in the execute return, found type '{type(returned).__name__}'.")
    if len(returned) != count:
        raise TritonModelException("Number of InferenceResponse objects do not match the number of InferenceRequest "
                                   f"objects. InferenceRequest(s) size is:{count}, and InferenceResponse(s) size "
                                   f"is:{len(returned)}")
    for response, rescheduled in zip(returned, again, strict=True):
        if response is not None and rescheduled:
            raise TritonModelException("Expected a None object in the execute function return list for reschduled "
                                       f"request, found type '{type(response).__name__}'.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("Expected an 'InferenceResponse' object in the execute function return list, "
                                       f"found type '{type(response).__name__}'.")
