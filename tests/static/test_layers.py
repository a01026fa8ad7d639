"""Import layers: the import-linter contracts in pyproject.toml hold (docs/architecture.md).

import-linter reads the source statically; nothing of the server is imported here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

COMPOSITION_ROOT = {"app", "cli", "__main__", "__init__"}


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_core_contract_lists_every_core_module() -> None:
    """A new kserve_v2 module is core unless it joins the composition root: the contract must name it."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    core = next(c for c in contracts if c["id"] == "core")
    package = ROOT / "kserve_v2"
    modules = {f"kserve_v2.{p.stem}" for p in package.glob("*.py") if p.stem not in COMPOSITION_ROOT}
    modules |= {f"kserve_v2.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    layered = {"kserve_v2.repository", "kserve_v2.grpc"}
    assert set(core["source_modules"]) == modules - layered
