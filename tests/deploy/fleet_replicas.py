"""The fleet drill's replicas (`make fleet-drill`): the ``runtime`` image run by podman as the KServe runtime runs
it (image_check.Container: uid 1000, read-only root, writable /tmp, capabilities dropped), on the host's network
with loopback ports of its own, in poll mode on an ``s3://`` repository; and what the drill reads of each from this
host: readiness, a model version's readiness, the repository index, its server process's RSS and open file
descriptors, its python stub processes.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import psutil

from image_check import CheckFailed, Container, podman, runtime_container

STUB_MODULE = "kserve_v2.runtime.python.stub"  # kserve_v2.runtime.python.environments.STUB_MODULE
PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port", "--model-repository")


def replica_args(repository: str, poll_secs: float) -> list[str]:
    """The ClusterServingRuntime's args (deploy/kserve/cluster-serving-runtime.yaml) with ``repository`` as the
    model repository, in poll mode every ``poll_secs`` seconds, without strict readiness; the ports come from the
    image's port variables.

    A poll-mode fleet runs with ``--strict-readiness=false`` (docs/deploy.md, "Fleet drill"): under Triton's strict
    readiness a broken version uploaded to the bucket makes every replica unready at once (the failed version
    counts, as in Triton's ``InferenceServer::IsReady``), so a balancer that follows readiness has none left,
    while each replica still serves the last good version."""
    container, _ = runtime_container()
    kept = [str(a) for a in container["args"] if not str(a).startswith((*PORT_FLAGS, "--strict-readiness"))]
    return [*kept, f"--model-repository={repository}", "--model-control-mode=poll",
            f"--repository-poll-secs={poll_secs:g}", "--strict-readiness=false"]


class Replica:
    """One replica: a container with the runtime's securityContext and resource limits on the host's network
    (``http``, ``grpc``, ``metrics`` ports)."""

    def __init__(self, image: str, args: list[str], env: dict[str, str]) -> None:
        spec, _ = runtime_container()
        hardening: dict[str, Any] = {key: spec[key] for key in ("securityContext", "resources") if key in spec}
        self.container = Container(image, args, hardening, None, env=env, host_network=True)
        self.name = self.container.name
        self.http, self.grpc, self.metrics = (self.container.port(p) for p in (8080, 8081, 8002))

    def start(self) -> None:
        """``podman start`` the stopped container again (same ports, same args), as the kubelet restarts it."""
        self.container.started = time.monotonic()
        podman("start", self.name)

    def wait_ready(self, budget: float = 120) -> float:
        """Seconds from (re)start to ready; raises CheckFailed when not ready within ``budget``."""
        return self.container.wait_ready(budget)

    def get(self, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, JSON body or None) of GET ``path`` on this replica's REST port (POST with a JSON ``body``)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", data=data)
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                content = reply.read()
                return reply.status, json.loads(content) if content else None
        except urllib.error.HTTPError as error:
            return error.code, None
        except OSError:
            return 0, None

    def version_ready(self, model: str, version: str) -> bool:
        """Whether ``GET /v2/models/<model>/versions/<version>/ready`` answers 200."""
        return self.get(f"/v2/models/{model}/versions/{version}/ready")[0] == 200

    def index(self) -> list[dict[str, Any]]:
        """The repository index (``POST /v2/repository/index``, Triton's repository extension)."""
        status, body = self.get("/v2/repository/index", {})
        if status != 200 or not isinstance(body, list):
            raise CheckFailed(f"{self.name}: repository index answered {status}")
        return body

    def log(self) -> str:
        """The container's log so far (stdout and stderr)."""
        return "".join(self.container.logs())

    def process(self) -> psutil.Process:
        """The server process (the container's PID 1) as this host sees it."""
        pid = int(podman("inspect", "--format", "{{.State.Pid}}", self.name).stdout.strip())
        if pid <= 0:
            raise CheckFailed(f"{self.name} is not running")
        return psutil.Process(pid)

    def usage(self) -> tuple[int, int]:
        """(RSS in bytes, open file descriptors) of the server process."""
        process = self.process()
        return process.memory_info().rss, process.num_fds()

    def stub(self, model: str) -> psutil.Process:
        """The python stub process of ``model``'s (single) instance; raises CheckFailed when none runs."""
        for child in self.process().children(recursive=True):
            command = " ".join(child.cmdline())
            if STUB_MODULE in command and model in command:
                return child
        raise CheckFailed(f"{self.name}: no stub process of model {model}")

    def remove(self) -> None:
        """Remove the container, running or not."""
        self.container.remove()
