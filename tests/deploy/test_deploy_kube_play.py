"""`make kube-play` (tests/deploy/kube_play.py) without podman: what it plays. The rendered cpu overlay keeps the kinds
podman plays, with the local image, one replica, names of the run and each container port published on loopback while
the args and probes keep the manifest's ports; the KServe runtime's container goes into a Pod unchanged but for the
image, the ports and the model volume. The plays themselves are `make kube-play`.
"""

from __future__ import annotations

from pathlib import Path

import kube_play
from deploy_support import KUSTOMIZE, kustomize
from image_check import runtime_container

HOST_PORTS = {8080: 18080, 8081: 18081, 8002: 18002}


def test_overlay_keeps_what_podman_plays_and_lists_the_rest() -> None:
    rendered = kustomize(KUSTOMIZE / "overlays" / "cpu")
    played, dropped = kube_play.for_podman(rendered, "localhost/img:tag", "run1", HOST_PORTS)
    assert sorted(d["kind"] for d in played) == ["Deployment", "PersistentVolumeClaim"]
    assert sorted(d["kind"] for d in dropped) == ["HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "Service",
                                                 "ServiceMonitor"]
    assert sorted(d["kind"] for d in played + dropped) == sorted(d["kind"] for d in rendered)
    [original] = [d for d in rendered if d["kind"] == "Deployment"]
    assert original["spec"]["replicas"] == 2 and original["metadata"]["name"] == "kserve-v2"  # the input is unchanged


def test_deployment_gets_the_image_one_replica_and_names_of_the_run() -> None:
    played, _ = kube_play.for_podman(kustomize(KUSTOMIZE / "overlays" / "cpu"), "localhost/img:tag", "run1", HOST_PORTS)
    [claim] = [d for d in played if d["kind"] == "PersistentVolumeClaim"]
    [deployment] = [d for d in played if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1 and deployment["metadata"]["name"] == "kserve-v2-run1"
    assert [c["image"] for c in pod["containers"]] == ["localhost/img:tag"]
    [models] = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert models["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"] == "kserve-v2-models-run1"


def test_ports_are_published_on_loopback_and_args_and_probes_keep_theirs() -> None:
    rendered = kustomize(KUSTOMIZE / "overlays" / "cpu")
    [original] = [d["spec"]["template"]["spec"]["containers"][0] for d in rendered if d["kind"] == "Deployment"]
    played, _ = kube_play.for_podman(rendered, "localhost/img:tag", "run1", HOST_PORTS)
    [container] = [d["spec"]["template"]["spec"]["containers"][0] for d in played if d["kind"] == "Deployment"]
    assert {p["containerPort"]: (p["hostIP"], p["hostPort"]) for p in container["ports"]} == {
        inside: ("127.0.0.1", host) for inside, host in HOST_PORTS.items()}
    assert container["args"] == original["args"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in kube_play.PROBES:
        assert container[probe] == original[probe]
        kind, port, _ = kube_play.probe_route(container[probe], named)
        assert kind == "grpc" and port in HOST_PORTS and f"--grpc-port={port}" in container["args"]


def test_named_probe_ports_resolve_to_the_container_port() -> None:
    probe = {"httpGet": {"path": "/v2/health/live", "port": "http"}}
    assert kube_play.probe_route(probe, {"http": 8080}) == ("httpGet", 8080, "/v2/health/live")
    assert kube_play.probe_route({"exec": {"command": ["sleep", "1"]}}, {}) == ("exec", 0, "sleep 1")


def test_runtime_container_goes_into_a_pod_unchanged_but_image_ports_and_models(tmp_path: Path) -> None:
    container, _ = runtime_container()
    pod = kube_play.runtime_pod(container, "localhost/img:tag", "runtime-run1", tmp_path, HOST_PORTS)
    [spec] = pod["spec"]["containers"]
    assert pod["kind"] == "Pod" and pod["metadata"]["name"] == "runtime-run1" and spec["image"] == "localhost/img:tag"
    for field in ("args", "lifecycle", "readinessProbe", "livenessProbe", "securityContext", "resources"):
        assert spec[field] == container[field], field
    assert {p["containerPort"]: p["hostPort"] for p in spec["ports"]} == HOST_PORTS
    assert {"name": "models", "mountPath": "/mnt/models", "readOnly": True} in spec["volumeMounts"]
    assert pod["spec"]["volumes"] == [{"name": "models", "hostPath": {"path": str(tmp_path), "type": "Directory"}}]
    assert "ports" not in container and "volumeMounts" not in container  # the runtime's own spec is not changed
