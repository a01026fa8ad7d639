"""The Dockerfiles: hadolint finds nothing, they name only files that exist, and the images are
what docs/deploy.md promises (no container engine needed: everything short of the build).

Promises: multi-stage, uid 1000, no pip or compilers in the final stage, the example repository only
in the `examples` target, `kserve-v2 serve` as entrypoint and command, EXPOSE 8080 8081 8002 (the
ports the server takes from the image's environment), no HEALTHCHECK, and a CUDA base whose major
version is the one onnxruntime-gpu's CUDA provider links against.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

import tomllib
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from deploy_support import BIN, parse_serve_args
from helpers import EXAMPLES, ROOT

DOCKERFILES = {"cpu": ROOT / "Dockerfile", "cuda": ROOT / "Dockerfile.cuda"}
PORTS = {"8080", "8081", "8002"}


def _structure(path: Path) -> list[dict[str, Any]]:
    """dockerfile-parse's instructions (continuation lines joined); it reads any file name from a file object."""
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes())).structure


def _stages(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Instructions of each build stage, by stage name, in order (comments left out)."""
    stages: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    for item in _structure(path):
        if item["instruction"] == "FROM":
            current = stages.setdefault(item["value"].split(" AS ")[-1].strip(), [])
        if current is not None and item["instruction"] != "COMMENT":
            current.append(item)
    return stages


def _values(stage: list[dict[str, Any]], instruction: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == instruction]


def _env(stage: list[dict[str, Any]]) -> dict[str, str]:
    return dict(token.split("=", 1) for value in _values(stage, "ENV") for token in shlex.split(value))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name: str) -> None:
    done = subprocess.run([str(BIN / "hadolint"), str(DOCKERFILES[name])], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_does_find_things(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN cd /tmp\n")
    done = subprocess.run([str(BIN / "hadolint"), str(bad)], capture_output=True, text=True)
    assert done.returncode != 0 and "DL3007" in done.stdout


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, pattern) for pattern in patterns for prefix in prefixes)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist_are_committed_and_reach_the_context(name: str) -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    tracked = set(subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout.split())
    copies = 0
    for stage in _stages(DOCKERFILES[name]).values():
        for value in _values(stage, "COPY"):
            words = [w for w in shlex.split(value) if not w.startswith("--")]
            if "--from=" in value:
                continue
            for source in words[:-1]:
                copies += 1
                assert (ROOT / source).exists(), f"COPY {source}: no such file"
                assert source in tracked or any(t.startswith(source.rstrip("/") + "/") for t in tracked), source
                assert not _ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"
    assert copies >= 8


@pytest.mark.parametrize("name", DOCKERFILES)
def test_image_layout(name: str) -> None:
    stages = _stages(DOCKERFILES[name])
    assert list(stages) == ["build", "base", "examples", "runtime"]  # the last stage is the default target
    base, examples, runtime = stages["base"], stages["examples"], stages["runtime"]
    assert _values(runtime, "FROM") == ["base AS runtime"] and len(runtime) == 1  # the server, no models
    assert _values(base, "USER") == ["1000"]
    assert any("--uid 1000" in run for run in _values(base, "RUN"))
    assert set(_values(base, "EXPOSE")[0].split()) == PORTS
    assert json.loads(_values(base, "ENTRYPOINT")[0]) == ["kserve-v2"]
    assert json.loads(_values(base, "CMD")[0]) == ["serve"]
    assert not any(i["instruction"] == "HEALTHCHECK" for stage in stages.values() for i in stage)
    # the final stage takes only the built environment, with pip removed in the build stage
    assert _values(base, "COPY") == ["--from=build /opt/kserve-v2 /opt/kserve-v2"]
    assert any("pip uninstall -y pip" in run for run in _values(stages["build"], "RUN"))
    for run in _values(base, "RUN"):
        assert not re.search(r"\b(gcc|g\+\+|build-essential|python3-dev|python3-pip|python3-venv|pip install)\b", run), run
    # examples only in the examples target
    assert _values(examples, "COPY") == ["--chown=1000:1000 examples/model_repository /models"]
    assert _env(examples)["KSERVE_V2_MODEL_REPOSITORY"] == "/models"
    assert not any("examples" in v for v in _values(base, "COPY") + _values(stages["build"], "COPY"))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_image_environment_gives_the_exposed_ports(name: str) -> None:
    """`kserve-v2 serve` with the image's environment listens on the EXPOSEd ports, models from /mnt/models."""
    env = _env(_stages(DOCKERFILES[name])["base"])
    assert env["KSERVE_V2_MODEL_REPOSITORY"] == "/mnt/models"
    env["KSERVE_V2_MODEL_REPOSITORY"] = str(EXAMPLES)
    [settings] = parse_serve_args(["serve"], env={k: v for k, v in env.items() if k.startswith("KSERVE_V2_")})
    assert {str(settings[k]) for k in ("http_port", "grpc_port", "metrics_port")} == PORTS
    assert (settings["http_port"], settings["grpc_port"]) == (8080, 8081)
    assert settings["model_repositories"] == [str(EXAMPLES)]


def _cuda_major_of_onnxruntime() -> int:
    spec = subprocess.run([sys.executable, "-c", "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    provider = Path(spec) / "capi" / "libonnxruntime_providers_cuda.so"
    if not provider.exists():
        pytest.skip("the installed onnxruntime has no CUDA provider (CPU build)")
    with open(provider, "rb") as handle:
        for section in ELFFile(handle).iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags("DT_NEEDED"):
                    if match := re.fullmatch(r"libcudart\.so\.(\d+)", tag.needed):
                        return int(match.group(1))
    raise AssertionError("the CUDA provider names no libcudart")


def test_cuda_base_matches_onnxruntime_gpu() -> None:
    args = _values(_structure(DOCKERFILES["cuda"]), "ARG")
    [image] = [a.split("=", 1)[1] for a in args if a.startswith("CUDA_IMAGE=")]
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+", image)
    assert match, image
    assert int(match.group(1)) == _cuda_major_of_onnxruntime()


def test_image_requirements_swap_only_onnxruntime() -> None:
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "deploy" / "docker" / "requirements.py")
    assert spec and spec.loader
    image_requirements = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(image_requirements)
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = re.findall(r"^onnxruntime-gpu==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    cpu = image_requirements.requirements("onnxruntime")
    gpu = image_requirements.requirements("onnxruntime-gpu")
    assert f"onnxruntime=={pin}" in cpu and f"onnxruntime-gpu=={pin}" in gpu
    rest = [d for d in dependencies if not d.startswith("onnxruntime-gpu")]
    assert [d for d in cpu if not d.startswith("onnxruntime")] == rest == [d for d in gpu if not d.startswith("onnxruntime")]
    [openvino_pin] = re.findall(r"^onnxruntime-openvino==(\S+)", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    openvino = image_requirements.requirements("onnxruntime-openvino")  # docker build --build-arg ONNXRUNTIME=...
    assert f"onnxruntime-openvino=={openvino_pin}" in openvino
    assert [d for d in openvino if not d.startswith("onnxruntime")] == rest
    with pytest.raises(ValueError):
        image_requirements.requirements("tensorflow")
    done = subprocess.run([sys.executable, "deploy/docker/requirements.py", "--onnxruntime", "onnxruntime"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == cpu


def test_image_requirements_add_the_object_storage_extras() -> None:
    """The images' ``EXTRAS`` (s3 gcs azure by default): each group of pyproject's optional dependencies after the
    server's own, in the order asked; an unknown extra is refused."""
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "deploy" / "docker" / "requirements.py")
    assert spec and spec.loader
    image_requirements = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(image_requirements)
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    plain = image_requirements.requirements("onnxruntime")
    with_extras = image_requirements.requirements("onnxruntime", ROOT, ["s3", "gcs", "azure"])
    assert with_extras[:len(plain)] == plain
    assert with_extras[len(plain):] == optional["s3"] + optional["gcs"] + optional["azure"]
    with pytest.raises(ValueError):
        image_requirements.requirements("onnxruntime", ROOT, ["dev-tools"])
    assert 'ARG EXTRAS="s3 gcs azure"' in (ROOT / "Dockerfile").read_text()
