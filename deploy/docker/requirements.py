"""Print the server's run-time requirements for a container image, one per line.

The project depends on ``onnxruntime-gpu`` (it carries the CPU execution provider too); the CPU
image installs the much smaller ``onnxruntime`` instead, at the version constraints.txt pins for
``onnxruntime-gpu``, or ``onnxruntime-openvino`` (the OpenVINO execution provider, for
``cpu_execution_accelerator: openvino``) at its own pin there. Used by the Dockerfiles' build stage
(standard library only):

    python deploy/docker/requirements.py --onnxruntime onnxruntime > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
GPU_PACKAGE = "onnxruntime-gpu"
OPENVINO_PACKAGE = "onnxruntime-openvino"
PACKAGES = ("onnxruntime", GPU_PACKAGE, OPENVINO_PACKAGE)


def requirements(onnxruntime: str, root: Path = ROOT) -> list[str]:
    """pyproject.toml's dependencies with ``onnxruntime-gpu`` swapped for the ``onnxruntime`` package
    named, pinned as constraints.txt pins onnxruntime-gpu (onnxruntime-openvino: as it pins that).

    Raises:
        ValueError: ``onnxruntime`` names another package, or constraints.txt pins no version for it.
    """
    if onnxruntime not in PACKAGES:
        raise ValueError(f"--onnxruntime must be one of {PACKAGES}, got '{onnxruntime}'")
    dependencies = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = OPENVINO_PACKAGE if onnxruntime == OPENVINO_PACKAGE else GPU_PACKAGE
    pins = re.findall(rf"^{re.escape(pinned)}==(\S+)", (root / "constraints.txt").read_text(), re.MULTILINE)
    if not pins:
        raise ValueError(f"constraints.txt pins no {pinned}")
    return [f"{onnxruntime}=={pins[0]}" if re.match(rf"{re.escape(GPU_PACKAGE)}\b", dep) else dep for dep in dependencies]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxruntime", choices=PACKAGES, default=GPU_PACKAGE, help="ONNX Runtime package to install")
    print("\n".join(requirements(parser.parse_args().onnxruntime)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
