"""`make image-check` (tests/deploy/image_check.py) without a container engine: the ServingRuntime's
securityContext and limits become the podman flags the check runs the image with, and the scripts
.ci/run calls are executable in a fresh clone. The build and run themselves are `make image-check`.
"""

from __future__ import annotations

import os
from pathlib import Path

import image_check
from deploy_support import DEPLOY
from helpers import ROOT


def test_kubernetes_quantities_become_podman_limits() -> None:
    assert [image_check.k8s_cpus(q) for q in ("1", "500m", "2")] == ["1", "0.5", "2"]
    assert [image_check.k8s_bytes(q) for q in ("2Gi", "512Mi", "1G", "1024")] == [
        str(2 * 2**30), str(512 * 2**20), str(10**9), "1024"]


def test_serving_runtime_runs_as_the_kubelet_runs_it(tmp_path: Path) -> None:
    """uid 1000, all capabilities dropped, no privilege escalation, its CPU and memory limits, a read-only root
    with a writable /tmp, the models read-only at /mnt/models and the three ports published on loopback."""
    container, grace = image_check.runtime_container()
    flags = image_check.run_flags(container, tmp_path, {8080: 18080, 8081: 18081, 8002: 18002})
    assert {"--detach", "--read-only", "--read-only-tmpfs=false", "--user=1000", "--cap-drop=ALL",
            "--security-opt=no-new-privileges", "--cpus=1", f"--memory={2 * 2**30}",
            f"--volume={tmp_path}:/mnt/models:ro", "--publish=127.0.0.1:18081:8081"} <= set(flags)
    assert any(f.startswith("--tmpfs=/tmp:") for f in flags)
    assert "--model-repository=/mnt/models" in container["args"] and "--log-format=json" in container["args"]
    # the pod's grace period (Kubernetes' default here), which counts from the preStop pause's start, leaves the
    # server's drain time to finish
    exit_timeout = next(int(a.split("=")[1]) for a in container["args"] if a.startswith("--exit-timeout-secs="))
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and grace > int(pre_stop[1]) + exit_timeout


def test_scripts_ci_runs_are_executable() -> None:
    for script in (DEPLOY / "docker" / "local_base.sh", DEPLOY / "docker" / "podman_host.sh", ROOT / ".ci" / "run"):
        assert os.access(script, os.X_OK), f"{script.relative_to(ROOT)} is not executable"
    assert (DEPLOY / "docker" / "containers.conf").read_text().count("default_ulimits = []") == 1
