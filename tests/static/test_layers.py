"""Import layers: the import-linter contracts in pyproject.toml hold (docs/development.md), and the
layers contract names every subpackage, so a new one cannot sit outside the stack.

import-linter reads the source statically; nothing of the server is imported here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import ROOT

import tomllib

COMPOSITION_ROOT = {"app", "cli", "__main__"}


def contract(contract_id: str) -> dict[str, Any]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["id"] == contract_id)


def layered(layers: list[str]) -> set[str]:
    """Every module a layers list names (a layer may hold siblings separated by ``|`` or ``:``)."""
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def children(package: Path) -> tuple[set[str], set[str]]:
    """(modules, subpackages) directly in ``package``, by name."""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    subpackages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return modules, subpackages


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_only_the_composition_root_sits_at_the_top_of_the_package() -> None:
    """Every other module lives in the subpackage of its concern."""
    modules, _ = children(ROOT / "kserve_v2")
    assert modules == COMPOSITION_ROOT


def test_the_layers_contract_names_every_subpackage() -> None:
    """The stack holds the composition root, every subpackage of kserve_v2, and the packages beside it."""
    modules, subpackages = children(ROOT / "kserve_v2")
    expected = {f"kserve_v2.{name}" for name in modules | subpackages} | {"transcoding", "adapters"}
    assert layered(contract("layers")["layers"]) == expected


def test_the_transcoding_contract_names_everything_in_transcoding() -> None:
    modules, subpackages = children(ROOT / "transcoding")
    assert layered(contract("transcoding")["layers"]) == modules | subpackages


def test_the_transport_library_contract_covers_every_layer_below_the_transports() -> None:
    """Everything under the transports layer is forbidden grpc, starlette and uvicorn."""
    layers = contract("layers")["layers"]
    below = next(i for i, layer in enumerate(layers) if "kserve_v2.grpc" in layer) + 1
    assert set(contract("transport-libraries")["source_modules"]) == layered(layers[below:]) | {"kserve_v2.workers"}
