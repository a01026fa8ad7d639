"""`make image-check`: build the CPU images with podman and run them as KServe and Kubernetes run them.

Builds the Dockerfile's ``runtime`` and ``examples`` targets (and, unless ``--no-openvino``, the
``runtime`` target with ``ONNXRUNTIME=onnxruntime-openvino``) on a local Debian base
(deploy/docker/local_base.sh, passed as ``--build-arg PYTHON_IMAGE``), from the files git tracks or
would track (no environment, cache or ignored model gets in). Then runs each image the way the
kubelet runs KServe's ``kserve-container``:

- the ClusterServingRuntime's own ``args`` (deploy/kserve/cluster-serving-runtime.yaml), after the
  image's entrypoint; its securityContext (uid 1000, all capabilities dropped, no privilege
  escalation) and resource limits; a read-only root file system with a writable ``/tmp`` only;
- the model repository (examples/model_repository plus a slow model) mounted read-only at
  ``/mnt/models``, where KServe's storage initializer puts it; the container ports published on
  free loopback ports.

And checks from this host with unmodified clients (tritonclient, grpcio-health-checking, urllib):
REST and gRPC readiness; ``grpc.health.v1`` Check and Watch; a ``simple`` infer over both
transports; ``/metrics``; SIGTERM as ``podman stop`` (the kubelet's) sends it, with requests in
flight: readiness off at once, every request answered, exit code 0 within the grace period, and
every line of the container's log JSON (``--log-format=json``). Then runs the ``runtime`` image once more with
its repository in an S3 bucket (``--model-repository=s3://...``, served by moto's S3 server on this host, the
container on the host's network, the credentials in its environment) and infers ``simple`` from it: the images
carry the ``s3``, ``gcs`` and ``azure`` extras. Prints each image's size and layers, and the cold start to ready.
Exits 1 on the first failed check, with the container's log.

podman reads deploy/docker/containers.conf (CONTAINERS_CONF, unless already set). Needs root (the
base is made with debootstrap). Run by .ci/run where deploy/docker/podman_host.sh says podman can
run containers here.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from deploy_support import KSERVE, load  # noqa: E402
from helpers import EXAMPLES, ROOT, add_model, matmul_model, timed_matmul_model, wait_admitted  # noqa: E402
from s3_store import MotoS3  # noqa: E402

DOCKER = ROOT / "deploy" / "docker"
TAG = "localhost/kserve-v2-check"
SLOW_SIZE, SLOW_ROWS, SLOW_SECONDS, IN_FLIGHT = 256, 64, 1.0, 4
SLOW_CONFIG = (f'max_batch_size: 0\ninput [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, {SLOW_SIZE}] }}]\n'
               'instance_group [{ kind: KIND_CPU count: 1 }]\n'
               'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n')
OPENVINO_CONFIG = ('max_batch_size: 8\ninstance_group [{ kind: KIND_CPU count: 1 }]\n'
                   'optimization { execution_accelerators { cpu_execution_accelerator: [{ name: "openvino" }] } }\n')
KUBERNETES_GRACE = 30  # terminationGracePeriodSeconds when a pod spec names none (KServe's predictor pods)


class CheckFailed(Exception):
    """A check did not hold; the message says which and what was seen."""


def check(condition: object, message: str) -> None:
    """Raise CheckFailed(message) unless ``condition`` is true."""
    if not condition:
        raise CheckFailed(message)


def podman(*args: str, check_rc: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run ``podman args``; raises CheckFailed with its stderr when it fails and ``check_rc``."""
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check_rc and done.returncode != 0:
        output = done.stdout[-4000:] + done.stderr[-4000:]
        raise CheckFailed(f"podman {' '.join(args[:3])} ... exited {done.returncode}:\n{output}")
    return done


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def dangling() -> set[str]:
    """The ids of podman's dangling images now (build stages, images whose tag a later build took)."""
    return set(podman("images", "--quiet", "--no-trunc", "--filter=dangling=true").stdout.split())


def build_context(target: Path) -> Path:
    """A copy of the files git tracks or would track (what a fresh clone has, plus new files), as the build context."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in listed:
        source = ROOT / name
        if name and source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@dataclass
class Built:
    """An image built by this check."""

    name: str
    seconds: float
    size: int  # bytes, as podman reports an image's size
    layers: int


def build(context: Path, base: str, name: str, target: str, *build_args: str) -> Built:
    """``podman build --target target`` on the local base; host network, as pip needs the package index."""
    start = time.monotonic()
    args = [f"--build-arg=PYTHON_IMAGE={base}", *(f"--build-arg={a}" for a in build_args)]
    podman("build", "--network=host", *args, f"--target={target}", f"--tag={name}", str(context), timeout=1800)
    seconds = time.monotonic() - start
    size, layers = podman("image", "inspect", "--format", "{{.Size}} {{len .RootFS.Layers}}", name).stdout.split()
    return Built(name, seconds, int(size), int(layers))


def local_base(base: str) -> str:
    """The local Debian base image ``base``, made by deploy/docker/local_base.sh when missing; its name.

    Raises:
        CheckFailed: the script failed (its stderr's tail).
    """
    made = subprocess.run([str(DOCKER / "local_base.sh"), base], capture_output=True, text=True)
    if made.returncode != 0:
        raise CheckFailed(f"local_base.sh exited {made.returncode}:\n{made.stderr[-4000:]}")
    return made.stdout.strip()


def build_runtime(stack: ExitStack, work: Path, base: str, name: str) -> Built:
    """The Dockerfile's ``runtime`` target built as ``name`` on the local base ``base`` (``local_base``), from a
    build context under ``work``; ``stack`` removes the image and the dangling images the build left at its close."""
    base_image = local_base(base)
    before = dangling()
    stack.callback(lambda: podman("rmi", "--force", *(dangling() - before), check_rc=False))
    stack.callback(podman, "rmi", "--force", name, check_rc=False)
    return build(build_context(work / "context"), base_image, name, "runtime")


def k8s_cpus(quantity: str) -> str:
    """A Kubernetes CPU quantity ("1", "500m") as podman's --cpus."""
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else quantity


def k8s_bytes(quantity: str) -> str:
    """A Kubernetes memory quantity ("2Gi", "512Mi", "1G", bytes) as podman's --memory (bytes)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return str(int(float(quantity[: -len(suffix)]) * factor))
    return quantity


def runtime_container() -> tuple[dict[str, Any], int]:
    """The ClusterServingRuntime's container and the pod's termination grace period (seconds)."""
    [runtime] = load(KSERVE / "cluster-serving-runtime.yaml")
    spec = runtime["spec"]
    return spec["containers"][0], int(spec.get("terminationGracePeriodSeconds", KUBERNETES_GRACE))


def run_flags(container: dict[str, Any], repository: Path | None, ports: dict[int, int]) -> list[str]:
    """``podman run`` flags for a pod's container as the kubelet would run it: detached, a read-only root file
    system with a writable /tmp (an emptyDir), the container's securityContext and resource limits, the model
    repository read-only at /mnt/models, and each container port published on a loopback port ({inside: host})."""
    security = container.get("securityContext", {})
    limits = container.get("resources", {}).get("limits", {})
    flags = ["--detach", "--read-only", "--read-only-tmpfs=false", "--tmpfs=/tmp:rw,mode=1777"]
    if "runAsUser" in security:
        flags.append(f"--user={security['runAsUser']}")
    flags += [f"--cap-drop={cap}" for cap in security.get("capabilities", {}).get("drop", [])]
    if security.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    if "cpu" in limits:
        flags.append(f"--cpus={k8s_cpus(str(limits['cpu']))}")
    if "memory" in limits:
        flags.append(f"--memory={k8s_bytes(str(limits['memory']))}")
    if repository is not None:
        flags.append(f"--volume={repository}:/mnt/models:ro")
    return flags + [f"--publish=127.0.0.1:{host}:{inside}" for inside, host in ports.items()]


# the image's port variables (its ENV), by the container port each sets
PORT_VARIABLES = {8080: "KSERVE_V2_HTTP_PORT", 8081: "KSERVE_V2_GRPC_PORT", 8002: "KSERVE_V2_METRICS_PORT"}


class Container:
    """One image run detached as the kubelet runs a pod's container, with its ports published on loopback.

    With ``host_network`` the container shares the host's network (it reaches services on the host's loopback,
    such as the S3 endpoint of ``serve_from_s3``) and listens on free ports of the host's loopback, set through
    the image's port variables (``PORT_VARIABLES``; ``args`` must not name ports or addresses). ``env`` is passed
    as ``--env``.
    """

    def __init__(self, image: str, args: list[str], container: dict[str, Any], repository: Path | None,
                 ports: tuple[int, ...] = (8080, 8081, 8002), env: dict[str, str] | None = None,
                 host_network: bool = False) -> None:
        self.name = f"kserve-v2-check-{os.getpid()}-{free_port()}"
        self.ports = {port: free_port() for port in ports}
        environment = dict(env or {})
        if host_network:
            environment.update({PORT_VARIABLES[inside]: str(host) for inside, host in self.ports.items()})
            # on the host's loopback only, as the published ports are
            environment.update({variable.replace("_PORT", "_ADDRESS"): "127.0.0.1" for variable in PORT_VARIABLES.values()})
            flags = [*run_flags(container, repository, {}), "--network=host"]
        else:
            flags = run_flags(container, repository, self.ports)
        flags = [f"--name={self.name}", *flags, *(f"--env={name}={value}" for name, value in environment.items())]
        self.started = time.monotonic()
        try:
            podman("run", *flags, image, *args)
        except CheckFailed:  # a container podman made but could not start would stay behind
            self.remove()
            raise

    def port(self, inside: int) -> int:
        """The loopback port that a container port is published on."""
        return self.ports[inside]

    def logs(self) -> tuple[str, str]:
        """(stdout, stderr) of the container so far."""
        done = podman("logs", self.name, check_rc=False)
        return done.stdout, done.stderr

    def state(self) -> dict[str, Any]:
        """podman's State of the container (Running, ExitCode, OOMKilled, ...)."""
        state: dict[str, Any] = json.loads(podman("inspect", "--format", "{{json .State}}", self.name).stdout)
        return state

    def wait_ready(self, budget: float = 120) -> float:
        """Seconds from ``podman run`` until GET /v2/health/ready answers 200; fails if the container exits first."""
        url = f"http://127.0.0.1:{self.port(8080)}/v2/health/ready"
        while time.monotonic() - self.started < budget:
            try:
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        return time.monotonic() - self.started
            except (urllib.error.URLError, OSError):
                pass
            check(self.state()["Running"], f"the container exited before it was ready:\n{self.describe()}")
            time.sleep(0.05)
        raise CheckFailed(f"not ready within {budget} s:\n{self.describe()}")

    def describe(self) -> str:
        """The container's state and the last lines of its log, for a failure message."""
        out, err = self.logs()
        state = self.state()
        return (f"state: running={state['Running']} exit={state['ExitCode']} oom={state.get('OOMKilled')}\n"
                f"stdout:\n{out[-6000:]}\nstderr:\n{err[-3000:]}")

    def remove(self) -> None:
        """Remove the container, running or not (SIGKILL at once)."""
        podman("rm", "--force", "--time=0", self.name, check_rc=False)


@contextmanager
def running(*args: Any, **kwargs: Any) -> Iterator[Container]:
    """A Container, removed afterwards whatever happens."""
    container = Container(*args, **kwargs)
    try:
        yield container
    finally:
        container.remove()


def health(port: int, service: str) -> int:
    """grpc.health.v1 Check(service): the status enum value; raises grpc.RpcError."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        status: int = reply.status
        return status


def infer_simple(container: Container) -> None:
    """Triton's ``simple`` (INT32 [1, 16] + and -) over gRPC and REST, with tritonclient as users call it."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{container.port(8081)}") as client:
        check(client.is_server_live() and client.is_server_ready(), "gRPC ServerLive/ServerReady not true")
        check(client.is_model_ready("simple"), "gRPC: model simple not ready")
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple", inputs)
        check(np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b),
              "gRPC simple: wrong sums or differences")
    client_http = httpclient.InferenceServerClient(f"127.0.0.1:{container.port(8080)}")
    try:
        check(client_http.is_server_live() and client_http.is_server_ready(), "REST /v2/health/live or ready not 200")
        hinputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        hinputs[0].set_data_from_numpy(a, binary_data=False)
        hinputs[1].set_data_from_numpy(b, binary_data=True)
        hresult = client_http.infer("simple", hinputs)
        check(np.array_equal(hresult.as_numpy("OUTPUT0"), a + b) and np.array_equal(hresult.as_numpy("OUTPUT1"), a - b),
              "REST simple: wrong sums or differences")
    finally:
        client_http.close()


def check_metrics(port: int, model: str, at_least: float) -> None:
    """/metrics is Prometheus text with ``nv_inference_request_success`` of ``model`` at ``at_least`` or more."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        check(reply.headers["Content-Type"].startswith("text/plain"), f"/metrics Content-Type {reply.headers['Content-Type']}")
        families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
    success = {s.labels.get("model"): s.value for s in families["nv_inference_request_success"].samples}
    check(success.get(model, 0) >= at_least, f"/metrics nv_inference_request_success{{model={model}}}: {success}")


def sigterm_drains(container: Container, grace: int) -> tuple[float, float]:
    """SIGTERM with requests in flight, sent as the kubelet sends it (``podman stop``: SIGTERM, SIGKILL at the grace
    period). Returns (seconds from SIGTERM to readiness off, seconds from SIGTERM to exit)."""
    grpc_port, http_port = container.port(8081), container.port(8080)
    data = np.ones((SLOW_ROWS, SLOW_SIZE), dtype=np.float32)
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    watched: list[int] = []
    watch_end: list[grpc.StatusCode] = []
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        watched.append(next(watch).status)  # the first message: the status now

        def follow() -> None:
            try:
                watched.extend(reply.status for reply in watch)
                watch_end.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                watch_end.append(error.code())

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            client.infer("slow", [tensor])  # warm up
            for _ in range(IN_FLIGHT):
                client.async_infer("slow", [tensor], callback=lambda result, error: done.put((result, error)))
            in_flight = wait_admitted(container.port(8002), "slow", 1 + IN_FLIGHT)
            check(in_flight >= 2, f"only {in_flight} requests in flight at SIGTERM: the slow model is too fast")
            sigterm = time.monotonic()
            stopper = threading.Thread(
                target=lambda: podman("stop", f"--time={grace}", container.name, check_rc=False, timeout=grace + 60))
            stopper.start()
            http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
            unready, answered = None, IN_FLIGHT
            while time.monotonic() - sigterm < 5:
                try:
                    ready = http.is_server_ready()
                except Exception:  # any failure to answer 200 counts as not ready, as for the kubelet
                    ready = False
                if not ready:
                    unready, answered = time.monotonic() - sigterm, done.qsize()
                    break
                time.sleep(0.05)
            http.close()
            check(unready is not None, "REST readiness still 200 five seconds after SIGTERM")
            check(answered < IN_FLIGHT, "the in-flight requests had all finished before readiness turned off")
            finished = [done.get(timeout=grace) for _ in range(IN_FLIGHT)]
            stopper.join(timeout=grace + 60)
            exited = time.monotonic() - sigterm
        follower.join(timeout=10)
    errors = [str(error) for _, error in finished if error]
    check(not errors, f"in-flight requests failed during the drain: {errors}")
    for result, _ in finished:
        check(np.allclose(result.as_numpy("OUTPUT0")[:2, :2], 1, rtol=1e-4), "slow: wrong result during the drain")
    state = container.state()
    check(not state["Running"] and state["ExitCode"] == 0 and exited < grace,
          f"exit code {state['ExitCode']} {exited:.1f} s after SIGTERM (grace period {grace} s):\n{container.describe()}")
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    check(watched[:1] == [serving] and not_serving in watched and watch_end in ([grpc.StatusCode.OK],
                                                                               [grpc.StatusCode.UNAVAILABLE]),
          f"grpc.health.v1 Watch: statuses {watched}, end {watch_end}")
    assert unready is not None
    return unready, exited


def check_json_logs(container: Container) -> tuple[int, int]:
    """Every line of the container's log, stdout and stderr as ``kubectl logs`` shows them, is a JSON object
    (``--log-format=json``), and one says the server is ready; the number of lines on (stdout, stderr).

    The server logs to stderr (kserve_v2.observability.log_settings); a line from a library (ONNX Runtime's
    warnings) fails here.
    """
    out, err = container.logs()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    records: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(line)
    check(lines and not bad, f"log lines that are not JSON objects: {bad[:5]} (of {len(lines)})")
    check(any("ready" in str(record.get("message")) for record in records), "no log line says the server is ready")
    return len(out.splitlines()), len(err.splitlines())


def check_pod_identity(container: Container, uid: int) -> None:
    """The server (PID 1) runs as ``uid`` and cannot write to the root file system; /tmp is writable."""
    status = podman("exec", container.name, "cat", "/proc/1/status").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    check(uids == [str(uid)] * 4, f"PID 1 runs as uids {uids}, not {uid}")
    root = podman("exec", container.name, "sh", "-c", "touch /opt/kserve-v2/x", check_rc=False)
    check(root.returncode != 0 and "Read-only" in root.stderr, f"the root file system is writable: {root.stderr}")
    podman("exec", container.name, "sh", "-c", "touch /tmp/x && rm /tmp/x")


def repository(target: Path, openvino: bool) -> Path:
    """examples/model_repository plus ``slow`` (about SLOW_SECONDS a request), and ``openvino`` when asked;
    readable by any uid, as a volume KServe's storage initializer fills."""
    shutil.copytree(EXAMPLES, target)
    add_model(target, "slow", timed_matmul_model(SLOW_SIZE, SLOW_ROWS, SLOW_SECONDS), SLOW_CONFIG)
    if openvino:
        add_model(target, "openvino", matmul_model(16, depth=2), OPENVINO_CONFIG)  # rows of ones stay ones
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def serve_as_kserve(image: Built, repo: Path, openvino: bool, report: Callable[[str], None]) -> None:
    """The runtime image with the ClusterServingRuntime's args: every check, then SIGTERM."""
    container_spec, grace = runtime_container()
    args = [str(a) for a in container_spec["args"]]
    uid = int(container_spec.get("securityContext", {}).get("runAsUser", 1000))
    with running(image.name, args, container_spec, repo) as container:
        cold = container.wait_ready()
        grpc_port = container.port(8081)
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("", "inference.GRPCInferenceService", "live"):
            check(health(grpc_port, service) == serving, f"grpc.health.v1 Check('{service}') is not SERVING")
        check_pod_identity(container, uid)
        infer_simple(container)
        check_metrics(container.port(8002), "simple", 2)
        if openvino:
            log = "".join(container.logs())
            check("openvino/1/model.onnx runs on OpenVINOExecutionProvider" in log,
                  f"model openvino does not run on OpenVINO:\n{log[-4000:]}")
            with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
                tensor = grpcclient.InferInput("INPUT0", [4, 16], "FP32")
                tensor.set_data_from_numpy(np.ones((4, 16), dtype=np.float32))
                check(np.allclose(client.infer("openvino", [tensor]).as_numpy("OUTPUT0"), 1, rtol=1e-4),
                      "openvino: wrong result")
        unready, exited = sigterm_drains(container, grace)
        stdout_lines, stderr_lines = check_json_logs(container)
    report(f"{image.name}: ready {cold:.1f} s after `podman run` (uid {uid}, read-only root, args from "
           f"cluster-serving-runtime.yaml); REST, gRPC, health Check and Watch, simple over both, /metrics ok; "
           f"SIGTERM: unready after {unready:.2f} s, {IN_FLIGHT} in-flight requests answered, exit 0 after "
           f"{exited:.1f} s (grace {grace} s); log: {stdout_lines} lines on stdout, {stderr_lines} on stderr, all JSON")


def serve_from_s3(image: Built, work: Path, report: Callable[[str], None]) -> None:
    """The runtime image reading its repository from an S3 bucket: moto's S3 server on this host holds
    examples/model_repository/simple under ``models/repo``; the container (hardened as the ClusterServingRuntime's,
    on the host's network) gets ``--model-repository=s3://127.0.0.1:<port>/models/repo`` and the AWS credentials
    in its environment, as a pod gets them from a Secret; ``simple`` is then inferred over REST and gRPC."""
    container_spec, _ = runtime_container()
    try:
        store = MotoS3(work / "moto.log")
    except RuntimeError as failure:
        raise CheckFailed(str(failure)) from failure
    with store:
        keys = store.upload(EXAMPLES / "simple", "models", "repo/simple")
        url = store.url("models", "repo")
        args = ["serve", f"--model-repository={url}", "--strict-readiness=true", "--log-format=json"]
        spec = {"securityContext": container_spec.get("securityContext", {})}
        with running(image.name, args, spec, None, env=store.credentials(), host_network=True) as container:
            try:
                cold = container.wait_ready()
                infer_simple(container)
            except CheckFailed as failure:
                raise CheckFailed(f"{image.name} did not serve model simple from the S3 repository {url} "
                                  f"(moto's S3 server on this host, {len(keys)} objects):\n{failure}") from failure
            secret = store.credentials()["AWS_SECRET_ACCESS_KEY"]
            check(secret not in "".join(container.logs()), "the container's log shows the S3 secret key")
    report(f"{image.name}: ready {cold:.1f} s after `podman run` with --model-repository={url} (moto's S3 server "
           f"on this host, credentials in the environment); simple over both ok")


def serve_examples(image: Built, report: Callable[[str], None]) -> None:
    """The examples image as `docker run IMAGE` runs it (no args, its own /models), hardened as a pod."""
    container_spec, _ = runtime_container()
    with running(image.name, [], {"securityContext": container_spec.get("securityContext", {})}, None) as container:
        cold = container.wait_ready()
        infer_simple(container)
        check_metrics(container.port(8002), "simple", 2)
    report(f"{image.name}: ready {cold:.1f} s after `podman run` with its default command; simple over both ok")


def main() -> int:
    """Make the base, build the images, run every check; 0 when all pass, 1 (after the reason on stderr) if not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="localhost/kserve-v2-base:bookworm", help="local base image to make or reuse")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false", help="skip the OpenVINO image")
    parser.add_argument("--keep", action="store_true", help="keep the images built (default: remove them)")
    options = parser.parse_args()
    os.environ.setdefault("CONTAINERS_CONF", str(DOCKER / "containers.conf"))
    started = time.monotonic()
    lines: list[str] = []

    def report(line: str) -> None:
        print(f"image-check: {line}", flush=True)
        lines.append(line)

    dangling_before = dangling()
    built: list[Built] = []
    try:
        base_start = time.monotonic()
        base = local_base(options.base)
        report(f"base {base} ready in {time.monotonic() - base_start:.0f} s")
        with tempfile.TemporaryDirectory(prefix="kserve-v2-image-check.") as work:
            context = build_context(Path(work) / "context")
            targets: list[tuple[str, str, tuple[str, ...]]] = [("cpu", "runtime", ()), ("cpu-examples", "examples", ())]
            if options.openvino:
                targets.append(("openvino", "runtime", ("ONNXRUNTIME=onnxruntime-openvino",)))
            for tag, target, build_args in targets:
                built.append(build(context, base, f"{TAG}:{tag}", target, *build_args))
                image = built[-1]
                report(f"built {image.name} (target {target}) in {image.seconds:.0f} s: {image.size / 2**20:.0f} MiB, "
                       f"{image.layers} layers")
            Path(work).chmod(0o755)
            serve_as_kserve(built[0], repository(Path(work) / "models", False), False, report)
            serve_examples(built[1], report)
            serve_from_s3(built[0], Path(work), report)
            if options.openvino:  # the openvino model fails to load without onnxruntime-openvino: its own repository
                serve_as_kserve(built[2], repository(Path(work) / "models-openvino", True), True, report)
    except (CheckFailed, AssertionError, subprocess.TimeoutExpired, queue.Empty) as failure:
        print(f"image-check FAILED: {failure}", file=sys.stderr, flush=True)
        return 1
    finally:
        if not options.keep:
            podman("rmi", "--force", *(image.name for image in built), check_rc=False)
        left = dangling() - dangling_before
        if left:  # the build stages of this run (and images this run's tags replaced)
            podman("rmi", "--force", *left, check_rc=False)
    report(f"passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
