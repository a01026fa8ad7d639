"""RepositoryModelLoad parameters: the ``config`` override and ``file:<path>`` files.

Semantics are Triton's (model repository extension, ``extension_model_repository.md``): ``config`` is ModelConfig JSON
that replaces config.pbtxt for this load; ``file:<version>/<path>`` parameters (bytes) form a
whole override model folder and require ``config``; any other key is rejected. Override files
are written only into a fresh private directory per load. Every path is checked first
(no ``..``, absolute path, backslash, NUL or over-long component): nothing is written for a request with one bad path.

A ``file:`` override that cannot form a model folder, and a ``config`` that is not ModelConfig JSON
(or names another model), are what Triton reports as a failed poll of the model: the client gets
Triton's text, the server log the detail (``OverrideError``), and the model keeps what it served.

A ``config`` override outlives its load as Triton's core keeps it (``model_repository_manager.cc``):
a later load without parameters keeps it until a file of the model's folder changes after it, or
the model is unloaded; a ``file:`` override is never kept (``KeptConfig``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from google.protobuf import json_format

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.errors import InternalError, InvalidInput, ServerError
from kserve_v2.repository.layout import modified_ns

FILE_PREFIX = "file:"
MAX_COMPONENT_BYTES = 255
MAX_DEPTH = 16
MAX_FILES = 64

log = logging.getLogger(__name__)


class OverrideError(Exception):
    """``file:`` overrides that cannot form the model folder; ``str()`` is the detail for the server log.

    Attributes:
        unsafe: a path that would leave the folder (or nest deeper than ``MAX_DEPTH``), refused
            as the request's fault; otherwise the folder could not be written or has no ``config``.
    """

    def __init__(self, detail: str, unsafe: bool) -> None:
        super().__init__(detail)
        self.unsafe = unsafe


@dataclass(frozen=True)
class LoadOverrides:
    """What a load request asks beyond "load this folder".

    Attributes:
        config_json: ModelConfig JSON replacing config.pbtxt, or None.
        files: relative path -> content, forming the model folder (empty: use the repository's).
    """

    config_json: str | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)


def parse_load_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> LoadOverrides:
    """Read RepositoryModelLoad parameters (``ModelRepositoryParameter`` messages).

    Raises:
        InvalidInput: an unknown key or a wrong type (Triton: "Unrecognized load parameter"), or
            more than ``MAX_FILES`` files -> INVALID_ARGUMENT.
        OverrideError: ``file:`` without ``config``, or a path ``check_relative_path`` refuses.
    """
    config_json: str | None = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        kind = value.WhichOneof("parameter_choice") or "unset"
        if key == "config" and kind == "string_param":
            config_json = value.string_param
        elif key.startswith(FILE_PREFIX) and kind == "bytes_param":
            files[check_relative_path(key[len(FILE_PREFIX):])] = value.bytes_param
        else:
            raise InvalidInput(f"Unrecognized load parameter '{key}' with type '{kind.removesuffix('_param')}'")
    if files and config_json is None:
        raise OverrideError("Load parameter 'config' must be specified for model file override", unsafe=False)
    if len(files) > MAX_FILES:
        raise InvalidInput(f"at most {MAX_FILES} file: load parameters are accepted")
    return LoadOverrides(config_json, files)


def parse_config_override(text: str, name: str) -> mc.ModelConfig:
    """Parse a ``config`` load parameter as Triton's core does while it polls the model
    (``JsonToModelConfig``: protobuf JSON, unknown fields refused).

    Raises:
        OverrideError: not ModelConfig JSON ("Invalid config override: <parser's text>"), or a
            ``name`` other than the model's (Triton's "unexpected directory name ..." text).
    """
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as err:
        raise OverrideError(f"Invalid config override: {err}", unsafe=False) from None
    if config.name and config.name != name:
        raise OverrideError(f"unexpected directory name '{name}' for model '{config.name}', directory name must equal "
                            "model name", unsafe=False)
    return config


@dataclass(frozen=True)
class KeptConfig:
    """A ``config`` override kept for the loads without parameters that follow it.

    Attributes:
        config_json: the override, as it was sent.
        stamp_ns: when it took the place of ``config.pbtxt`` (wall clock, ns); a later load without
            parameters keeps it while no file of the model's folder is newer (``layout.modified_ns``).
    """

    config_json: str
    stamp_ns: int

    @classmethod
    def taken(cls, config_json: str, folder: Path, config_file: str) -> KeptConfig:
        """Keep ``config_json`` from now. Triton stamps the override with the time of the load when
        the folder has a config file, else with the folder's own time (``SetModelConfigModifiedTime``)."""
        stamp = time.time_ns() if (folder / config_file).is_file() else modified_ns(folder)
        return cls(config_json, stamp)


def check_relative_path(path: str) -> str:
    """Return ``path`` if it is a safe relative path inside a model folder.

    Rejects empty, absolute, ``.``/``..`` components, backslashes and NUL, components over 255
    bytes and paths deeper than 16 components.

    Raises:
        OverrideError: an unsafe path (``unsafe``); a component no file system holds (not ``unsafe``).
    """
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise OverrideError(f"file: path '{path[:300]}' must be a non-empty relative path", unsafe=True)
    if len(parts) > MAX_DEPTH:
        raise OverrideError(f"file: path '{path[:300]}' is deeper than {MAX_DEPTH} components", unsafe=True)
    for part in parts:
        if part.strip() in ("", ".", ".."):
            raise OverrideError(f"file: path '{path[:300]}' has an empty, '.' or '..' component", unsafe=True)
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise OverrideError(f"file: path has a component longer than {MAX_COMPONENT_BYTES} bytes", unsafe=False)
    return str(PurePosixPath(*parts))


def write_private_folder(files: Mapping[str, bytes]) -> Path:
    """Write override files into a new private directory (mode 0700) and return it.

    The directory is new and holds only what is written here, so no symlink can redirect a
    write; every target is still checked to resolve inside it.

    Raises:
        OverrideError: a path that leaves the folder (``unsafe``) or cannot be written; nothing
            is left behind.
    """
    root = Path(tempfile.mkdtemp(prefix="kserve_v2_override_")).resolve()
    try:
        for relative, content in files.items():
            target = (root / relative).resolve()
            if not target.is_relative_to(root) or target == root:
                raise OverrideError(f"file: path '{relative}' leaves the model folder", unsafe=True)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            except OSError as err:  # e.g. "a" and "a/b": a file where a folder must go
                raise OverrideError(f"file: path '{relative}' cannot be written: {err.strerror}", unsafe=False) from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def poll_failure(name: str, err: OverrideError) -> ServerError:
    """Triton's answer to ``file:`` overrides that cannot form the model folder, or a ``config`` that
    ``parse_config_override`` refuses (its core reports them as a failed poll of the model): "failed
    to load '<m>', failed to poll from model repository", INTERNAL / HTTP 500, with the detail in the
    server log only; a path that would leave the folder stays INVALID_ARGUMENT / 400 (same text)."""
    log.error("Poll failed for model directory '%s': %s", name, err)
    text = f"failed to load '{name}', failed to poll from model repository"
    return InvalidInput(text) if err.unsafe else InternalError(text)
