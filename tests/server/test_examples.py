"""The example programs in examples/ run against the server on the example repository and print PASS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT

PROGRAMS = ["grpc_health_metadata.py", "grpc_simple_infer.py", "grpc_async_infer.py",
            "grpc_stream_infer.py", "grpc_string_infer.py", "grpc_sequence_infer.py", "grpc_sequence_infer.py -d",
            "grpc_decoupled_stream.py"]


@pytest.mark.parametrize("program", PROGRAMS)
def test_example_program_passes(example_server, program: str) -> None:
    name, *flags = program.split()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), "-u", example_server.url, *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "PASS"


def test_example_models_script_rebuilds_the_committed_repository(tmp_path) -> None:
    """The committed example models are exactly what build_example_models.py writes, beside the python
    models, whose model.py and config.pbtxt are written by hand."""
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_models.py"), str(tmp_path)], check=True)
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "examples/model_repository"],
                            capture_output=True, text=True, check=True).stdout.split()
    python = {p.parent.name for p in (ROOT / "examples" / "model_repository").glob("*/config.pbtxt")
              if 'backend: "python"' in p.read_text()}
    assert python == {"simple_python", "bls_simple", "word_stream"}
    generated = [p.removeprefix("examples/model_repository/") for p in listed]
    assert [str(p) for p in built] == sorted(p for p in generated if p.split("/")[0] not in python)
    for path in built:
        assert (tmp_path / path).read_bytes() == (ROOT / "examples" / "model_repository" / path).read_bytes(), path
