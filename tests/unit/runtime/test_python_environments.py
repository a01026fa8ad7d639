"""``EXECUTION_ENV_PATH`` (Triton's python_backend README, "Using Custom Execution Environments"): folders and
packed archives, unpacked once per modification, with Triton's checks."""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import pytest

from kserve_v2.runtime.python.environments import open_environment, stub_command


def environment(folder: Path, python: str = sys.executable) -> Path:
    """A minimal environment folder: bin/activate and bin/python3 (a link to ``python``)."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "activate").write_text("# activate\n")
    os.symlink(python, folder / "bin" / "python3")
    (folder / "lib").mkdir()
    return folder


def pack(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as packed:
        for entry in sorted(folder.iterdir()):
            packed.add(entry, arcname=entry.name)
    return archive


def test_a_folder_is_used_where_it_is(tmp_path: Path) -> None:
    folder = environment(tmp_path / "env")
    opened = open_environment("$$TRITON_MODEL_DIRECTORY/env", tmp_path)
    assert opened.prefix == folder.resolve() and opened.python == folder.resolve() / "bin" / "python3"
    assert opened.variables["VIRTUAL_ENV"] == str(opened.prefix)
    assert opened.variables["PATH"].startswith(f"{opened.prefix}/bin{os.pathsep}")
    assert opened.variables["LD_LIBRARY_PATH"].split(os.pathsep)[0] == f"{opened.prefix}/lib"
    assert "PYTHONPATH" not in opened.variables
    command = stub_command(opened)
    assert command[0] == str(opened.python) and "kserve_v2.runtime.python.stub" in command[2]
    assert stub_command(None) == [sys.executable, "-m", "kserve_v2.runtime.python.stub"]


def test_a_conda_prefix_is_named_as_conda_names_it(tmp_path: Path) -> None:
    folder = environment(tmp_path / "env")
    (folder / "conda-meta").mkdir()
    opened = open_environment(str(folder), tmp_path)
    assert opened.variables["CONDA_PREFIX"] == str(folder.resolve())


def test_an_archive_is_unpacked_once_per_modification(tmp_path: Path) -> None:
    archive = pack(environment(tmp_path / "env"), tmp_path / "env.tar.gz")
    first = open_environment(str(archive), tmp_path)
    assert first.prefix.parent.name.startswith("kserve_v2_python_env_") and (first.prefix / "bin" / "activate").is_file()
    (first.prefix / "bin" / "activate").unlink()
    (first.prefix / "bin" / "activate").write_text("changed here")
    assert open_environment(str(archive), tmp_path).prefix == first.prefix  # not unpacked again
    assert (first.prefix / "bin" / "activate").read_text() == "changed here"
    os.utime(archive, ns=(archive.stat().st_atime_ns, archive.stat().st_mtime_ns + 10**9))
    again = open_environment(str(archive), tmp_path)  # modified: unpacked again, into the same folder
    assert again.prefix == first.prefix and (again.prefix / "bin" / "activate").read_text() == "# activate\n"


@pytest.mark.parametrize(("make", "reason"), [
    (lambda tmp: tmp / "absent.tar.gz", "Failed to get the canonical path for .*absent.tar.gz."),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty",
     r"Path .*empty/bin/activate does not exist. The Python environment should contain an 'activate' script."),
])
def test_triton_checks(make, reason: str, tmp_path: Path) -> None:  # noqa: ANN001 - a maker of the path
    with pytest.raises(ValueError, match=reason):
        open_environment(str(make(tmp_path)), tmp_path)


def test_an_escaping_member_or_a_bad_archive_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    (tmp_path / "x").write_text("x")
    with tarfile.open(evil, "w:gz") as packed:
        packed.add(tmp_path / "x", arcname="../outside")
    with pytest.raises(ValueError, match="cannot be unpacked"):
        open_environment(str(evil), tmp_path)
    assert not (tmp_path.parent / "outside").exists()
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="cannot be unpacked"):
        open_environment(str(tmp_path / "junk.tar.gz"), tmp_path)


def test_another_python_version_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 2.7\n")
    fake.chmod(0o755)
    environment(tmp_path / "env", str(fake))
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    with pytest.raises(ValueError, match=f"the environment's Python is 2.7; python models need the server's Python {ours}"):
        open_environment(str(tmp_path / "env"), tmp_path)
