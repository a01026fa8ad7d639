"""Custom execution environments of python models: the ``EXECUTION_ENV_PATH`` parameter (Triton's
python_backend README, "Creating Custom Execution Environments" and "Using Custom Execution
Environments"), whose instances then run in stub processes of their own with that environment's
interpreter (``kserve_v2.runtime.python.process``).

The value names a packed environment (a ``.tar.gz`` made by ``conda-pack``, or any tar archive of an
environment prefix) or an environment folder; ``$$TRITON_MODEL_DIRECTORY`` in it stands for the
model's folder. An archive is unpacked once into a folder of this process (``kserve_v2_python_env_*``
in the temporary folder, removed at exit), and again when its modification time changes, as
Triton's ``EnvironmentManager`` does; a folder is used where it is. Either must hold
``bin/activate`` (Triton's check) and a ``bin/python3`` of the server's Python minor version: the
stub imports this package and, where the environment lacks them, the server's own packages
(numpy, protobuf) from the server's ``sys.path``, after the environment's own, so the
environment's packages win.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
STUB_MODULE = "kserve_v2.runtime.python.stub"
# run by the environment's interpreter: the server's paths go after its own, then the stub runs as __main__
_BOOT = ("import json, runpy, sys; sys.path += json.loads(sys.argv.pop(1)); "
         f"runpy.run_module({STUB_MODULE!r}, run_name='__main__', alter_sys=True)")


@dataclass(frozen=True)
class Environment:
    """A python model's execution environment, ready to run its stub processes.

    Attributes:
        prefix: the environment's folder (unpacked).
        python: its interpreter.
        variables: the environment variables its stub processes run with (the server's, with the
            prefix's ``bin`` first on ``PATH``, its ``lib`` on ``LD_LIBRARY_PATH`` as Triton adds it,
            ``CONDA_PREFIX`` or ``VIRTUAL_ENV``, and no ``PYTHONPATH`` / ``PYTHONHOME``).
    """

    prefix: Path
    python: Path
    variables: dict[str, str] = field(repr=False)

    def stub_command(self) -> list[str]:
        """The stub's command line, to which the caller adds its settings argument."""
        standard = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
        standard |= {os.path.join(path, "lib-dynload") for path in list(standard)}
        server_paths = [path for path in sys.path if path and path not in standard and not path.endswith(".zip")]
        return [str(self.python), "-c", _BOOT, json.dumps(server_paths)]


def stub_command(environment: Environment | None) -> list[str]:
    """The stub's command line (the caller adds its settings): the server's interpreter without an environment."""
    return [sys.executable, "-m", STUB_MODULE] if environment is None else environment.stub_command()


class _Unpacked:
    """The archives unpacked by this process: canonical path -> (folder, modification time ns)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folders: dict[Path, tuple[Path, int]] = {}
        self._base: Path | None = None

    def folder(self, archive: Path) -> Path:
        """``archive`` unpacked (again when it changed since).

        Raises:
            ValueError: it is not a tar archive, or a member would land outside its folder.
        """
        with self._lock:
            modified = archive.stat().st_mtime_ns
            known = self._folders.get(archive)
            if known is not None and known[1] == modified:
                return known[0]
            if self._base is None:
                self._base = Path(tempfile.mkdtemp(prefix="kserve_v2_python_env_"))
                atexit.register(_remove, self._base, os.getpid())
            target = known[0] if known is not None else self._base / str(len(self._folders))
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            try:
                with tarfile.open(archive) as packed:
                    # 'tar': no absolute or escaping member paths; links may point anywhere, as conda-pack's and venvs' do
                    packed.extractall(target, filter="tar")
            except (tarfile.TarError, OSError) as err:
                shutil.rmtree(target, ignore_errors=True)
                raise ValueError(f"{PARAMETER} '{archive}' cannot be unpacked: {err}") from None
            self._folders[archive] = (target, modified)
            return target


_UNPACKED = _Unpacked()
_VERSIONS: dict[Path, str] = {}  # interpreter -> its "major.minor", as it answered


def _remove(folder: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked worker replica
        shutil.rmtree(folder, ignore_errors=True)


def open_environment(value: str, model_dir: Path) -> Environment:
    """The environment ``EXECUTION_ENV_PATH`` names for the model in ``model_dir`` (see the module docstring).

    Raises:
        ValueError: the path does not exist (Triton's "Failed to get the canonical path for <p>."), cannot
            be unpacked, has no ``bin/activate`` (Triton's text) or no ``bin/python3``, or its Python is not
            the server's minor version; the model's load fails with the text.
    """
    given = Path(value.replace(MODEL_DIRECTORY, str(model_dir)))
    try:
        canonical = given.resolve(strict=True)
    except OSError:
        raise ValueError(f"Failed to get the canonical path for {given}.") from None
    prefix = canonical if canonical.is_dir() else _UNPACKED.folder(canonical)
    activate = prefix / "bin" / "activate"
    if not activate.is_file():
        raise ValueError(f"Path {activate} does not exist. The Python environment should contain an 'activate' script.")
    python = next((prefix / "bin" / name for name in ("python3", "python") if (prefix / "bin" / name).exists()), None)
    if python is None:
        raise ValueError(f"{PARAMETER} '{value}': the environment has no bin/python3")
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    theirs = _version(python)
    if theirs != ours:
        raise ValueError(f"{PARAMETER} '{value}': the environment's Python is {theirs or 'not runnable'}; python models "
                         f"need the server's Python {ours} (Triton needs its stub's version)")
    variables = {key: item for key, item in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    variables["PATH"] = os.pathsep.join(filter(None, (str(prefix / "bin"), os.environ.get("PATH", ""))))
    variables["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (str(prefix / "lib"),
                                                                 os.environ.get("LD_LIBRARY_PATH", ""))))
    variables["CONDA_PREFIX" if (prefix / "conda-meta").is_dir() else "VIRTUAL_ENV"] = str(prefix)
    return Environment(prefix, python, variables)


def _version(python: Path) -> str:
    """The ``major.minor`` version of the interpreter ``python`` (asked once), or "" when it does not run."""
    known = _VERSIONS.get(python)
    if known is None:
        try:
            answer = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                    capture_output=True, text=True, timeout=60, check=True)
            known = answer.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            known = ""
        _VERSIONS[python] = known
    return known
