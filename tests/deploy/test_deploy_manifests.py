"""Every manifest under deploy/ renders and validates offline, and the fields we rely on agree with the server.

Core kinds are checked with kubernetes-validate (strict: unknown fields fail) against the oldest
Kubernetes with GA gRPC probes (1.27) and the newest it knows; KServe kinds against the JSON
Schemas made from KServe's CRDs (../shared/k8s). Schemas leave much open, so the tests also
assert what the deployment depends on: the container's arguments parse with our CLI, the probes
and Services point at the ports the server listens on, and the drain fits in the grace period.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from deploy_support import (KSERVE, KUSTOMIZE, OVERLAYS, SHARED_K8S, kustomize, kustomize_with_component, load, one,
                            parse_serve_args, with_repository)
from helpers import EXAMPLES

K8S_VERSIONS = ("1.27.0", "1.37.0")
CORE_KINDS = {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
CRD_KINDS = {"ServiceMonitor"}  # Prometheus Operator's: no schema offline, fields asserted below


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return kustomize(KUSTOMIZE / "overlays" / request.param)


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in named, f"probe names port '{port}', the container has {sorted(named)}"
    return named[port]


def _validate_core(doc: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_rendered_document_validates(rendered: list[dict[str, Any]]) -> None:
    kinds = {doc["kind"] for doc in rendered}
    assert kinds == CORE_KINDS | CRD_KINDS
    for doc in rendered:
        if doc["kind"] in CORE_KINDS:
            _validate_core(doc)


def test_an_invalid_document_is_caught() -> None:
    """The validator is strict: a misspelt probe field fails (so the passing tests above mean something)."""
    deployment = one(kustomize(KUSTOMIZE / "overlays" / "cpu"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_core(deployment)


def test_container_args_parse_and_ports_match_probes_and_services(rendered: list[dict[str, Any]]) -> None:
    container = _container(rendered)
    assert container["command"] == ["kserve-v2"]
    [settings] = parse_serve_args(with_repository(container["args"], EXAMPLES))
    assert "exit" not in settings, settings
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings["http_port"], "grpc": settings["grpc_port"], "metrics": settings["metrics_port"]}
    # gRPC probes: readiness on "" (ServerReady), liveness on "live" (ServerLive), both on the gRPC port
    for probe, service in (("startupProbe", ""), ("readinessProbe", ""), ("livenessProbe", "live")):
        assert _port_number(container, container[probe]["grpc"]["port"]) == settings["grpc_port"]
        assert container[probe]["grpc"].get("service", "") == service
    # the model repository is the mounted volume
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert settings["model_repositories"] == [str(EXAMPLES)]
    assert "--model-repository=/mnt/models" in container["args"] and mounts["/mnt/models"]["readOnly"] is True
    # every Service port reaches a named container port; gRPC is marked for L7 balancers
    for service in (d for d in rendered if d["kind"] == "Service"):
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports and port["port"] == ports[port["targetPort"]]
    main = one(rendered, "Service", "kserve-v2")
    assert {p["name"]: p.get("appProtocol") for p in main["spec"]["ports"]} == {
        "grpc": "grpc", "http": "http", "metrics": "http"}
    assert one(rendered, "Service", "kserve-v2-headless")["spec"]["clusterIP"] == "None"


def test_startup_budget_and_drain_fit(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    container = _container(rendered)
    [settings] = parse_serve_args(with_repository(container["args"], EXAMPLES))
    startup = container["startupProbe"]
    assert startup.get("initialDelaySeconds", 0) + startup["periodSeconds"] * startup["failureThreshold"] >= 300
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + settings["exit_timeout_secs"]
    assert settings["strict_readiness"] is True
    strategy = one(rendered, "Deployment")["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0


def test_selectors_reach_the_pods(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = [deployment["spec"]["selector"]["matchLabels"], one(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]]
    selectors += [s["spec"]["selector"] for s in rendered if s["kind"] == "Service"]
    for selector in selectors:
        assert selector and selector.items() <= labels.items(), selector
    monitor = one(rendered, "ServiceMonitor")
    service = one(rendered, "Service", "kserve-v2")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    hpa = one(rendered, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    claim = one(rendered, "PersistentVolumeClaim")["metadata"]["name"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == claim


def test_hpa_metric_is_the_adapter_rule_on_a_metric_the_server_exports() -> None:
    """The rule's series is nv_inference_pending_request_count (test_deploy_probes scrapes it from a live server)."""
    hpa = one(kustomize(KUSTOMIZE / "overlays" / "cpu"), "HorizontalPodAutoscaler")["spec"]
    [metric] = hpa["metrics"]
    [rule] = load(KUSTOMIZE / "prometheus-adapter-rules.yaml")[0]["rules"]["custom"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert rule["seriesQuery"].startswith("nv_inference_pending_request_count{")
    assert hpa["minReplicas"] >= 2  # with maxUnavailable 1 in the PDB, a drain keeps one replica serving


def test_overlays_differ_where_they_should() -> None:
    cpu, gpu = (_container(kustomize(KUSTOMIZE / "overlays" / o)) for o in OVERLAYS)
    assert cpu["image"] == "kserve-v2:cpu" and gpu["image"] == "kserve-v2:cuda"
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["startupProbe"]["failureThreshold"] > cpu["startupProbe"]["failureThreshold"]
    # a replica per CPU of the limit on CPU pods; one on GPU pods (each replica would hold its own GPU copies)
    assert "--workers=auto" in cpu["args"] and "--workers=1" in gpu["args"] and "--workers=auto" not in gpu["args"]
    for container in (cpu, gpu):
        assert container["resources"]["requests"] and container["resources"]["limits"]


def test_http_probes_component_renders(tmp_path: Path) -> None:
    docs = kustomize_with_component(tmp_path, "http-probes")
    container = _container(docs)
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert "grpc" not in container["readinessProbe"]
    _validate_core(one(docs, "Deployment"))


# KServe


def _schema(kind: str) -> dict[str, Any]:
    files = list(SHARED_K8S.glob(f"{kind}-*.json"))
    if not files:
        pytest.skip(f"../shared/k8s has no {kind} schema")
    return json.loads(files[0].read_text())


def _check(doc: dict[str, Any]) -> None:
    schema = _schema(doc["kind"])
    jsonschema.validators.validator_for(schema)(schema).validate(doc)


KSERVE_FILES = sorted(KSERVE.glob("*.yaml"))


@pytest.mark.parametrize("path", KSERVE_FILES, ids=[p.name for p in KSERVE_FILES])
def test_kserve_manifest_validates(path: Path) -> None:
    for doc in load(path):
        _check(doc)


def test_kserve_schema_catches_a_wrong_field() -> None:
    [runtime] = load(KSERVE / "cluster-serving-runtime.yaml")
    runtime["spec"]["supportedModelFormats"][0]["autoSelect"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        _check(runtime)


def _runtime() -> dict[str, Any]:
    [runtime] = load(KSERVE / "cluster-serving-runtime.yaml")
    return runtime


def test_runtime_matches_kserve_tritons_where_users_expect_it() -> None:
    triton_path = SHARED_K8S / "kserve-tritonserver-runtime.yaml"
    if not triton_path.exists():
        pytest.skip("../shared/k8s has no Triton runtime")
    [triton] = load(triton_path)
    ours = _runtime()
    container = ours["spec"]["containers"][0]
    triton_container = triton["spec"]["containers"][0]
    assert container["name"] == triton_container["name"] == "kserve-container"
    assert container["securityContext"] == triton_container["securityContext"]
    assert ours["spec"]["protocolVersions"] == triton["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
    assert ours["spec"]["annotations"] == triton["spec"]["annotations"]
    formats = {(f["name"], f["version"]) for f in ours["spec"]["supportedModelFormats"]}
    assert formats == {("onnx", "1"), ("triton", "2")}
    assert formats <= {(f["name"], f["version"]) for f in triton["spec"]["supportedModelFormats"]}


def test_runtime_args_parse_and_ports_match() -> None:
    runtime = _runtime()
    container = runtime["spec"]["containers"][0]
    [settings] = parse_serve_args(with_repository(container["args"], EXAMPLES))
    assert "exit" not in settings, settings
    assert settings["model_repositories"] == [str(EXAMPLES)]
    assert (settings["http_port"], settings["grpc_port"]) == (8080, 8081)  # KServe's HTTP and gRPC ports
    assert str(settings["metrics_port"]) == runtime["spec"]["annotations"]["prometheus.kserve.io/port"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == settings["http_port"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
           "spec": {"containers": [container]}}
    _validate_core(pod)  # the container, strictly, as Kubernetes will see it


def test_kserve_triton_runtime_args_start_this_server_unchanged() -> None:
    """KServe's own Triton runtime, with its image switched to ours, keeps its args."""
    triton_path = SHARED_K8S / "kserve-tritonserver-runtime.yaml"
    if not triton_path.exists():
        pytest.skip("../shared/k8s has no Triton runtime")
    [triton] = load(triton_path)
    args = triton["spec"]["containers"][0]["args"]
    assert args[0] == "tritonserver"
    [settings] = parse_serve_args(with_repository(args, EXAMPLES))
    assert "exit" not in settings, settings
    assert settings["model_repositories"] == [str(EXAMPLES)]
    assert (settings["http_port"], settings["grpc_port"], settings["allow_http"]) == (8080, 9000, True)


@pytest.mark.parametrize("path", sorted(KSERVE.glob("inferenceservice-*.yaml")), ids=lambda p: p.name)
def test_inference_services_use_the_runtime(path: Path) -> None:
    runtime = _runtime()
    [service] = load(path)
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert {"name": model["modelFormat"]["name"], "version": model["modelFormat"]["version"]} in [
        {"name": f["name"], "version": f["version"]} for f in runtime["spec"]["supportedModelFormats"]]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"]
    # KServe appends the InferenceService's args to the runtime's
    args = runtime["spec"]["containers"][0]["args"] + model.get("args", [])
    [settings] = parse_serve_args(with_repository(args, EXAMPLES))
    assert "exit" not in settings, settings


def test_triton_spellings_are_aliases() -> None:
    ours, triton, both, grpc_off, strict, sagemaker = parse_serve_args(
        ["serve", "--model-repository", str(EXAMPLES), "--strict-readiness=false", "--exit-timeout-secs=7"],
        ["tritonserver", f"--model-store={EXAMPLES}", "--allow-grpc=true", "--allow-http=false",
         "--strict-model-config=false", "--allow-sagemaker=false", "--allow-vertex-ai=false",
         "--strict-readiness=false", "--exit-timeout-secs=7", "--log-verbose=1"],
        ["tritonserver", "--model-store", str(EXAMPLES), "--model-repository", str(EXAMPLES / "simple")],
        ["tritonserver", f"--model-store={EXAMPLES}", "--allow-grpc=false"],
        ["tritonserver", f"--model-store={EXAMPLES}", "--strict-model-config=true"],
        ["tritonserver", f"--model-store={EXAMPLES}", "--allow-sagemaker=true"],
    )
    assert triton["model_repositories"] == ours["model_repositories"] == [str(EXAMPLES)]
    assert (triton["strict_readiness"], triton["exit_timeout_secs"], triton["allow_http"], triton["log_verbose"]) == (
        False, 7, False, 1)
    assert ours["allow_http"] is True
    assert both["model_repositories"] == [str(EXAMPLES), str(EXAMPLES / "simple")]  # both spellings append
    # what this server cannot switch is a clear usage error, not silently ignored
    assert grpc_off == sagemaker == {"exit": 2}
    assert strict["model_load"]["auto_complete"] is False  # Triton's deprecated spelling of --disable-auto-complete-config


def test_object_storage_component_fills_the_repository_folder(tmp_path: Path) -> None:
    docs = kustomize_with_component(tmp_path, "object-storage")
    assert "PersistentVolumeClaim" not in {d["kind"] for d in docs}
    deployment = one(docs, "Deployment")
    _validate_core(deployment)
    pod = deployment["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(volumes["models"]) == {"name", "emptyDir"}
    uri, destination = init["args"]
    assert uri.startswith("s3://")
    assert {"name": "models", "mountPath": destination} in init["volumeMounts"]
    # the server reads the folder the init container wrote
    server = pod["containers"][0]
    assert f"--model-repository={destination}" in server["args"]
    assert {m["mountPath"]: m["name"] for m in server["volumeMounts"]}[destination] == "models"
