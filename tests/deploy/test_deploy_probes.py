"""The manifests' container command and args run here as a real server, and their probes are executed
against it the way the kubelet executes them.

Kubelet semantics: a gRPC probe is grpc.health.v1 Check(service) and succeeds only on SERVING; an
HTTP probe succeeds on a status from 200 to 399; both fail on a timeout or a refused connection.
The in-cluster model folder (/mnt/models) becomes a copy of examples/model_repository (plus a slow
model for in-flight requests), and the container ports become free local ports.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from deploy_support import BIN, KSERVE, KUSTOMIZE, kustomize, kustomize_with_component, load, one, with_repository
from helpers import EXAMPLES, ROOT, add_model, free_port, matmul_model, wait_admitted

SIZE = 1024
SLOW_CONFIG = (f'max_batch_size: 0\ninput [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, {SIZE}] }}]\n'
               'instance_group [{ kind: KIND_CPU count: 1 }]\n'
               'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')


class Pod:
    """One container of a manifest, run as a local process with its ports moved to free local ones."""

    def __init__(self, container: dict[str, Any], repository: Path, log: Path) -> None:
        self.container = container
        declared = {int(a.split("=")[1]) for a in container["args"] if a.split("=")[0].endswith("-port")}
        self.ports = {port: free_port() for port in declared}
        self.names = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        args = [self._move_port(a) for a in with_repository(container["args"], repository)]
        command = [str(BIN / c) if c == "kserve-v2" else c for c in container.get("command", ["kserve-v2"])]
        loopback = ["--grpc-address=127.0.0.1", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1"]
        # a port the args leave at its default (Triton's args name no metrics port) gets a free one too
        loopback += [f"--{kind}-port=0" for kind in ("grpc", "http", "metrics")
                     if not any(a.startswith(f"--{kind}-port=") for a in args)]
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("KSERVE_V2_")} | {"PYTHONUNBUFFERED": "1"}
        with open(log, "w") as out:
            self.proc = subprocess.Popen(command + args + loopback, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.started = time.monotonic()

    def _move_port(self, arg: str) -> str:
        name, _, value = arg.partition("=")
        return f"{name}={self.ports[int(value)]}" if name.endswith("-port") else arg

    def port(self, declared: int | str) -> int:
        """The local port of a container port, by number or by name."""
        return self.ports[self.names[declared] if isinstance(declared, str) else declared]

    def probe(self, name: str) -> bool:
        """Run the container's probe once, as the kubelet does."""
        spec = self.container[name]
        timeout = spec.get("timeoutSeconds", 1)
        if "grpc" in spec:
            with grpc.insecure_channel(f"127.0.0.1:{self.port(spec['grpc']['port'])}") as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=spec["grpc"].get("service", "")), timeout=timeout)
                except grpc.RpcError:
                    return False
                return reply.status == health_pb2.HealthCheckResponse.SERVING
        url = f"http://127.0.0.1:{self.port(spec['httpGet']['port'])}{spec['httpGet']['path']}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return 200 <= response.status < 400
        except (urllib.error.URLError, OSError):
            return False

    def wait_for(self, check: Callable[[], bool], budget: float) -> float:
        """Seconds until ``check`` holds, polled often; fails past ``budget`` seconds or if the process exits."""
        start = time.monotonic()
        while time.monotonic() - start < budget:
            if check():
                return time.monotonic() - start
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}:\n{self.log.read_text()}"
            time.sleep(0.1)
        raise AssertionError(f"not within {budget} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _budget(spec: dict[str, Any]) -> float:
    """The seconds a startup probe allows (Kubernetes: initialDelaySeconds + periodSeconds x failureThreshold)."""
    return spec.get("initialDelaySeconds", 0) + spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3)


def _deployment_container(variant: str, tmp_path: Path) -> dict[str, Any]:
    docs = kustomize_with_component(tmp_path, "http-probes") if variant == "http-probes" else kustomize(KUSTOMIZE / "overlays" / "cpu")
    return one(docs, "Deployment")["spec"]["template"]["spec"]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    shutil.copytree(EXAMPLES, repo)
    add_model(repo, "slow", matmul_model(SIZE, depth=40), SLOW_CONFIG)
    return repo


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.stop()


@pytest.mark.parametrize("variant", ["grpc-probes", "http-probes"])
def test_deployment_is_ready_within_the_startup_budget(variant: str, tmp_path: Path, repository: Path, pods: list[Pod]) -> None:
    container = _deployment_container(variant, tmp_path)["containers"][0]
    pod = Pod(container, repository, tmp_path / "server.log")
    pods.append(pod)
    pod.wait_for(lambda: pod.probe("startupProbe"), _budget(container["startupProbe"]))
    assert pod.probe("readinessProbe") and pod.probe("livenessProbe")
    # the HPA's series (through the Prometheus adapter) is on the metrics port once a model has had a request
    with grpcclient.InferenceServerClient(f"127.0.0.1:{pod.port('grpc')}") as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        client.infer("identity_fp32", [tensor])
    with urllib.request.urlopen(f"http://127.0.0.1:{pod.port('metrics')}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    samples = {s.labels["model"]: s.value for s in families["nv_inference_pending_request_count"].samples}
    assert samples.get("identity_fp32") == 0


def test_kserve_runtime_container_is_ready_by_its_probes(tmp_path: Path, repository: Path, pods: list[Pod]) -> None:
    [runtime] = load(KSERVE / "cluster-serving-runtime.yaml")
    container = runtime["spec"]["containers"][0]
    pod = Pod(container | {"command": ["kserve-v2"]}, repository, tmp_path / "server.log")  # the image's entrypoint
    pods.append(pod)
    assert pod.port(8080) and pod.port(8081)
    pod.wait_for(lambda: pod.probe("readinessProbe"), 300)
    assert pod.probe("livenessProbe")


def test_kserve_triton_runtime_args_serve(tmp_path: Path, repository: Path, pods: list[Pod]) -> None:
    """KServe's own Triton runtime with our image: its args as they are, V2 ready over HTTP and gRPC."""
    triton = ROOT.parent / "shared" / "k8s" / "kserve-tritonserver-runtime.yaml"
    if not triton.exists():
        pytest.skip("../shared/k8s has no Triton runtime")
    container = load(triton)[0]["spec"]["containers"][0]
    probes = {"readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": 8080}},
              "startupProbe": {"grpc": {"port": 9000}}}
    pod = Pod(container | {"command": ["kserve-v2"]} | probes, repository, tmp_path / "server.log")
    pods.append(pod)
    pod.wait_for(lambda: pod.probe("readinessProbe") and pod.probe("startupProbe"), 300)


@pytest.mark.parametrize("variant", ["grpc-probes", "http-probes"])
def test_sigterm_turns_unready_first_and_in_flight_requests_finish_in_the_grace_period(
        variant: str, tmp_path: Path, repository: Path, pods: list[Pod]) -> None:
    spec = _deployment_container(variant, tmp_path)
    container = spec["containers"][0]
    pod = Pod(container, repository, tmp_path / "server.log")
    pods.append(pod)
    pod.wait_for(lambda: pod.probe("startupProbe"), _budget(container["startupProbe"]))
    # The kubelet runs preStop (sleep N: endpoints stop sending here meanwhile), then SIGTERM; SIGKILL comes at
    # terminationGracePeriodSeconds after preStop began. So the drain has grace - N seconds.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_budget = spec["terminationGracePeriodSeconds"] - int(pre_stop[1])
    data = np.ones((512, SIZE), dtype=np.float32)  # about a second a request on one thread
    done: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{pod.port('grpc')}") as client:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        client.infer("slow", [tensor])  # warm up
        for _ in range(6):
            client.async_infer("slow", [tensor], callback=lambda result, error: done.put((time.monotonic(), result, error)))
        # all six admitted, most in flight, as the gauge the HPA scales on shows
        assert wait_admitted(pod.port("metrics"), "slow", 1 + 6) >= 3, "requests finished too fast to be in flight"
        assert pod.probe("readinessProbe")
        sigterm = time.monotonic()
        pod.proc.send_signal(signal.SIGTERM)
        unready_after = pod.wait_for(lambda: not pod.probe("readinessProbe"), container["readinessProbe"]["periodSeconds"])
        unready = sigterm + unready_after
        finished = [done.get(timeout=drain_budget) for _ in range(6)]
    assert [str(error) for _, _, error in finished if error] == [], pod.log.read_text()
    for _, result, _ in finished:
        np.testing.assert_allclose(result.as_numpy("OUTPUT0")[:2, :2], np.ones((2, 2)), rtol=1e-4)
    assert unready < max(at for at, _, _ in finished), "readiness turned off only after the in-flight requests"
    assert pod.proc.wait(timeout=drain_budget) == 0
    assert time.monotonic() - sigterm < drain_budget
