"""Print the server's run-time requirements for a container image, one per line.

The project depends on ``onnxruntime-gpu`` (it carries the CPU execution provider too); the CPU
image installs the much smaller ``onnxruntime`` instead, at the version constraints.txt pins for
``onnxruntime-gpu``, or ``onnxruntime-openvino`` (the OpenVINO execution provider, for
``cpu_execution_accelerator: openvino``) at its own pin there. ``--extras`` adds the requirements of
pyproject.toml's optional dependencies named (the images take ``s3 gcs azure``: the libraries that read
``s3://``, ``gs://`` and ``as://`` model repositories); ``pip install -c constraints.txt`` pins them. Used
by the Dockerfiles' build stage (standard library only):

    python deploy/docker/requirements.py --onnxruntime onnxruntime --extras "s3 gcs azure" > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
GPU_PACKAGE = "onnxruntime-gpu"
OPENVINO_PACKAGE = "onnxruntime-openvino"
PACKAGES = ("onnxruntime", GPU_PACKAGE, OPENVINO_PACKAGE)


def requirements(onnxruntime: str, root: Path = ROOT, extras: Sequence[str] = ()) -> list[str]:
    """pyproject.toml's dependencies with ``onnxruntime-gpu`` swapped for the ``onnxruntime`` package
    named, pinned as constraints.txt pins onnxruntime-gpu (onnxruntime-openvino: as it pins that), then
    the requirements of each optional dependency group in ``extras`` not already listed.

    Raises:
        ValueError: ``onnxruntime`` names another package, constraints.txt pins no version for it, or
            an extra is not one of pyproject.toml's optional dependency groups.
    """
    if onnxruntime not in PACKAGES:
        raise ValueError(f"--onnxruntime must be one of {PACKAGES}, got '{onnxruntime}'")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    dependencies: list[str] = project["dependencies"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise ValueError(f"--extras {unknown}: pyproject.toml's optional dependencies are {sorted(optional)}")
    pinned = OPENVINO_PACKAGE if onnxruntime == OPENVINO_PACKAGE else GPU_PACKAGE
    pins = re.findall(rf"^{re.escape(pinned)}==(\S+)", (root / "constraints.txt").read_text(), re.MULTILINE)
    if not pins:
        raise ValueError(f"constraints.txt pins no {pinned}")
    listed = [f"{onnxruntime}=={pins[0]}" if re.match(rf"{re.escape(GPU_PACKAGE)}\b", dep) else dep for dep in dependencies]
    for extra in extras:
        listed += [dep for dep in optional[extra] if dep not in listed]
    return listed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxruntime", choices=PACKAGES, default=GPU_PACKAGE, help="ONNX Runtime package to install")
    parser.add_argument("--extras", default="", help="optional dependency groups to add, separated by spaces or commas")
    options = parser.parse_args()
    print("\n".join(requirements(options.onnxruntime, extras=options.extras.replace(",", " ").split())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
