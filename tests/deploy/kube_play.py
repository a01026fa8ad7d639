"""`make kube-play`: deploy/k8s's cpu overlay and the KServe runtime's container run by ``podman kube play`` (issue 53).

Builds the Dockerfile's ``runtime`` target as `make image-check` does (tests/deploy/image_check.py) unless ``--image``
names one, then plays two pods and checks each from this host:

1. ``kubectl kustomize deploy/k8s/overlays/cpu``, reduced to the kinds podman plays (PersistentVolumeClaim, Deployment;
   each other kind is offered to ``podman kube play`` alone, which refuses it) and changed only where a single host
   needs it (``for_podman``): the local image, one replica, names of this run, and each container port published on a
   free loopback port (``hostIP``/``hostPort``; the args and the probes keep the manifest's ports, inside the pod's
   network namespace). The PersistentVolumeClaim is played first, and the volume podman makes of it is filled with
   examples/model_repository's ``simple`` (``podman volume import``), as an operator fills the claim;
2. the ClusterServingRuntime's container (deploy/kserve/cluster-serving-runtime.yaml) in a Pod (``runtime_pod``): its
   args, env, probes, lifecycle, securityContext and resources as KServe copies them into the predictor pod, the same
   ``simple`` at /mnt/models (a read-only hostPath volume: KServe's storage initializer fills an emptyDir there).

For each: the server answers (GET /v2/health/ready 200, ``simple`` over REST and gRPC); every probe's route answers
(HTTP from inside the pod, gRPC ``grpc.health.v1`` from this host) and the probe podman acts on (the livenessProbe, as a
healthcheck) is run with ``podman healthcheck run``; the container runs as the manifest says (``podman inspect`` and
/proc/1/status: uid, read-only root, capabilities, no-new-privileges, seccomp, limits); ``podman pod stop`` shows
whether a preStop hook and the grace period were applied. Prints a markdown table of every field and kind: what podman
did with it (applied, ran, ignored, refused, not run here) and the evidence; exits 1 when a check of something podman
supports fails. Every pod, volume and image it made is removed at exit (Ctrl-C, SIGTERM and the ``--time-limit``
SIGALRM included). Needs root and podman (deploy/docker/podman_host.sh says whether they work here).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from grpc_health.v1 import health_pb2  # noqa: E402

from deploy_support import KUSTOMIZE, kustomize, kustomize_with_component  # noqa: E402
from fleet_drill import interrupted  # noqa: E402
from helpers import EXAMPLES  # noqa: E402
from image_check import (  # noqa: E402
    DOCKER,
    CheckFailed,
    Container,
    build_runtime,
    check,
    check_metrics,
    check_pod_identity,
    free_port,
    health,
    infer_simple,
    podman,
    runtime_container,
)

TAG = "localhost/kserve-v2-kubeplay:runtime"
PLAYED_KINDS = ("PersistentVolumeClaim", "ConfigMap", "Pod", "Deployment")  # podman-kube-play(1), podman 4.3
PAUSE = "localhost/podman-pause"  # the image podman builds for a pod's infra container when it has none
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
MODELS = ("simple",)  # of examples/model_repository: what the played pods serve
# Deployment fields that podman-kube-play(1)'s support table (podman 4.3) marks unsupported, and what that means here
UNSUPPORTED = {
    "strategy (RollingUpdate maxSurge/maxUnavailable)": "no rollout: `kube play --replace` deletes the pod, then plays it",
    "revisionHistoryLimit": "no rollout history",
}


@dataclass
class Row:
    """One line of the table: a manifest field or kind, what podman did with it, the evidence, and whether a check of
    something podman supports failed."""

    subject: str
    field: str
    outcome: str  # applied | ran | ignored | refused | not run here, or what went wrong (applied, wrong port ...)
    evidence: str
    failed: bool = False


def publish(container: dict[str, Any], host_ports: dict[int, int]) -> None:
    """Publish each containerPort of ``container`` on 127.0.0.1:``host_ports[port]`` (adds ports the spec lacks)."""
    ports = container.setdefault("ports", [])
    known = {int(p["containerPort"]) for p in ports}
    ports.extend({"containerPort": inside, "protocol": "TCP"} for inside in host_ports if inside not in known)
    for port in ports:
        port.update(hostIP="127.0.0.1", hostPort=host_ports[int(port["containerPort"])])


def for_podman(docs: list[dict[str, Any]], image: str, suffix: str,
               host_ports: dict[int, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rendered manifests as this host plays them: (played, dropped). Played keeps PLAYED_KINDS, with every container's
    image set to ``image``, the Deployment at one replica, each object and claim named ``<name>-<suffix>``, and each
    container port published on loopback (``publish``); the args and probes keep their ports. Dropped: the other
    kinds, unchanged."""
    played = [copy.deepcopy(d) for d in docs if d["kind"] in PLAYED_KINDS]
    dropped = [d for d in docs if d["kind"] not in PLAYED_KINDS]
    for doc in played:
        doc["metadata"]["name"] = f"{doc['metadata']['name']}-{suffix}"
        if doc["kind"] not in ("Pod", "Deployment"):
            continue
        if doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = 1
        pod = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
        for volume in pod.get("volumes", []):
            if volume.get("persistentVolumeClaim"):
                volume["persistentVolumeClaim"]["claimName"] += f"-{suffix}"
        for container in pod["containers"]:
            container["image"] = image
            publish(container, host_ports)
    return played, dropped


def runtime_pod(container: dict[str, Any], image: str, name: str, repository: Path,
                host_ports: dict[int, int]) -> dict[str, Any]:
    """The ClusterServingRuntime's ``container`` in a Pod named ``name``, as KServe puts it in a predictor pod: its own
    fields unchanged but the image (``image``), ``repository`` read-only at /mnt/models (a hostPath volume where the
    storage initializer's emptyDir is), and its ports published on loopback (``publish``)."""
    spec = copy.deepcopy(container)
    spec["image"] = image
    spec.setdefault("volumeMounts", []).append({"name": "models", "mountPath": "/mnt/models", "readOnly": True})
    publish(spec, host_ports)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [spec],
                     "volumes": [{"name": "models", "hostPath": {"path": str(repository), "type": "Directory"}}]}}


def probe_route(probe: dict[str, Any], ports: dict[str, int]) -> tuple[str, int, str]:
    """A probe's action as (kind, container port, path or gRPC service): kind is httpGet, grpc, tcpSocket or exec;
    a named port is looked up in ``ports`` (name -> containerPort)."""
    for kind in ("httpGet", "grpc", "tcpSocket"):
        if kind in probe:
            action = probe[kind]
            port = ports[action["port"]] if isinstance(action["port"], str) else int(action["port"])
            return kind, port, str(action.get("path", action.get("service", "")))
    return "exec", 0, " ".join(probe.get("exec", {}).get("command", []))


class Played(Container):
    """A container that ``podman kube play`` started: image_check's Container checks without its ``podman run``."""

    def __init__(self, name: str, host_ports: dict[int, int]) -> None:
        self.name, self.ports, self.started = name, dict(host_ports), time.monotonic()

    def inspect(self) -> dict[str, Any]:
        """``podman inspect`` of the container."""
        [found] = json.loads(podman("inspect", self.name).stdout)
        data: dict[str, Any] = found
        return data

    def get_inside(self, port: int, path: str) -> str:
        """GET http://localhost:port/path from inside the pod (the image's python); the status, or the error."""
        code = ("import sys, urllib.request, urllib.error\ntry:\n print(urllib.request.urlopen(sys.argv[1], timeout=5)"
                ".status)\nexcept urllib.error.HTTPError as e:\n print(e.code)\nexcept OSError as e:\n print(e)")
        done = podman("exec", self.name, "python", "-c", code, f"http://localhost:{port}{path}", check_rc=False)
        return (done.stdout + done.stderr).strip()


def play(path: Path) -> subprocess.CompletedProcess[str]:
    """``podman kube play`` of one file (its pods started); raises CheckFailed when podman fails."""
    return podman("kube", "play", str(path), timeout=180)


def write(path: Path, docs: list[dict[str, Any]]) -> Path:
    """``docs`` as one multi-document YAML file at ``path``."""
    path.write_text("---\n".join(json.dumps(doc, indent=1) + "\n" for doc in docs))
    return path


def pod_container(pod: str, container: str) -> str:
    """The name podman gave ``container`` of the pod ``pod`` (a Deployment's pod is ``<name>-pod-0``)."""
    names = json.loads(podman("pod", "inspect", pod).stdout)["Containers"]
    [found] = [c["Name"] for c in names if c["Name"].endswith(f"-{container}")]
    return str(found)


def repository(target: Path) -> Path:
    """MODELS of examples/model_repository copied to ``target``, readable by any uid (podman applies no fsGroup)."""
    for model in MODELS:
        shutil.copytree(EXAMPLES / model, target / model)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def check_serving(ctr: Played, subject: str) -> list[Row]:
    """Ready over REST, ``simple`` over REST and gRPC, /metrics counting it."""
    cold = ctr.wait_ready()
    infer_simple(ctr)
    check_metrics(ctr.port(8002), "simple", 2)
    return [Row(subject, "command, args, containerPorts (+ hostIP/hostPort added)", "applied",
                f"GET /v2/health/ready 200 {cold:.1f} s after `podman kube play` returned; simple inferred over REST and gRPC; "
                "/metrics counts it")]


def healthcheck_row(ctr: Played, subject: str, field: str, test: list[str], aim: tuple[int, str], route: str,
                    route_ok: bool, play_log: str) -> Row:
    """The livenessProbe as podman made it a healthcheck (``test``: podman's Test): whether its URL is the probe's
    (``aim``: container port, path), and ``podman healthcheck run``'s result, with why it failed when it did."""
    command = " ".join(test[1:])
    url = re.search(r"http://[^/\s]+:(\d+)(\S*)", command)
    aimed = url is None or (int(url.group(1)), url.group(2)) == aim
    done = podman("healthcheck", "run", ctr.name, check_rc=False)
    tool = test[1] if len(test) > 1 else ""
    missing = podman("exec", ctr.name, "sh", "-c", f"command -v {tool}", check_rc=False).returncode != 0
    evidence = f"healthcheck `{command}`: `podman healthcheck run` rc {done.returncode} ({done.stdout.strip()})"
    if "systemd" in play_log:
        evidence += "; podman times no periodic runs (no systemd here)"
    failed = not route_ok
    if not aimed:  # podman 4.3 writes a named port as 0
        outcome = "applied, wrong port"
        evidence += f"; the probe's port is {aim[0]} (named in the manifest)"
    elif done.returncode == 0:
        outcome = "ran"
    elif missing:  # podman runs the probe's client inside the container
        outcome = "applied, cannot run here"
        evidence += f"; the image has no `{tool}`"
    else:
        outcome, failed = "ran", True
    return Row(subject, field, outcome, f"{evidence}; the route: {route}", failed=failed)


def check_probes(ctr: Played, subject: str, spec: dict[str, Any], play_log: str) -> list[Row]:
    """Each probe's route answers, and what podman made of it: the livenessProbe as a healthcheck (run now), the
    others nothing."""
    rows: list[Row] = []
    named = {str(p["name"]): int(p["containerPort"]) for p in spec.get("ports", []) if "name" in p}
    test = (ctr.inspect()["Config"].get("Healthcheck") or {}).get("Test") or []
    for probe_name in PROBES:
        if probe_name not in spec:
            continue
        kind, port, target = probe_route(spec[probe_name], named)
        if kind == "httpGet":
            answer = ctr.get_inside(port, target)
            route_ok, route = answer == "200", f"GET localhost:{port}{target} inside the pod: {answer}"
        elif kind == "grpc":
            status = health(ctr.port(port), target)
            route_ok = status == health_pb2.HealthCheckResponse.SERVING
            route = f"grpc.health.v1 Check('{target}') on {port}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
        else:
            route_ok, route = True, f"{kind} {target}"
        field = f"{probe_name} ({kind})"
        if probe_name != "livenessProbe" or not test:
            why = ("podman 4.3 makes a healthcheck of httpGet, tcpSocket and exec only" if probe_name == "livenessProbe"
                   else "podman 4.3 reads the livenessProbe only")
            rows.append(Row(subject, field, "ignored", f"no healthcheck of it ({why}); the route: {route}",
                            failed=not route_ok))
            continue
        rows.append(healthcheck_row(ctr, subject, field, test, (port, target), route, route_ok, play_log))
    return rows


def check_security(ctr: Played, subject: str, spec: dict[str, Any], pod_security: dict[str, Any]) -> list[Row]:
    """The securityContext and resources as podman applied them: ``podman inspect`` and the server's /proc/1/status."""
    security = {**pod_security, **spec.get("securityContext", {})}
    data = ctr.inspect()
    host, config = data["HostConfig"], data["Config"]
    lines = [line.split(":", 1) for line in podman("exec", ctr.name, "cat", "/proc/1/status").stdout.splitlines()]
    status = {pair[0]: pair[1].split() for pair in lines if len(pair) == 2}
    rows: list[Row] = []

    def row(field: str, expected: object, seen: object, evidence: str) -> None:
        rows.append(Row(subject, field, "applied" if expected == seen else "not applied", evidence,
                        failed=expected != seen))

    uid, gid = security.get("runAsUser"), security.get("runAsGroup")
    if uid is not None:
        row("securityContext.runAsUser" + ("/runAsGroup" if gid is not None else ""),
            [str(uid)] * 4 + ([str(gid)] * 4 if gid is not None else []),
            status["Uid"] + (status["Gid"] if gid is not None else []),
            f"Config.User {config.get('User')}; /proc/1/status Uid {' '.join(status['Uid'])} Gid {' '.join(status['Gid'])}")
    if security.get("readOnlyRootFilesystem"):
        check_pod_identity(ctr, int(uid or 0))
        row("securityContext.readOnlyRootFilesystem", True, host["ReadonlyRootfs"],
            f"HostConfig.ReadonlyRootfs {host['ReadonlyRootfs']}; a write under /opt/kserve-v2 fails (Read-only), "
            "/tmp (emptyDir) is writable")
    drop = security.get("capabilities", {}).get("drop", [])
    if drop:
        row(f"securityContext.capabilities.drop {drop}", "0" * 16, status["CapEff"][0],
            f"/proc/1/status CapEff {status['CapEff'][0]}, CapBnd {status['CapBnd'][0]}; HostConfig.CapDrop has "
            f"{len(host['CapDrop'])}")
    if security.get("allowPrivilegeEscalation") is False:
        row("securityContext.allowPrivilegeEscalation: false", "1", status["NoNewPrivs"][0],
            f"HostConfig.SecurityOpt {host['SecurityOpt']}; /proc/1/status NoNewPrivs {status['NoNewPrivs'][0]}")
    if "privileged" in security:
        row("securityContext.privileged", bool(security["privileged"]), host["Privileged"],
            f"HostConfig.Privileged {host['Privileged']}")
    if "seccompProfile" in security:
        rows.append(Row(subject, "pod securityContext.seccompProfile RuntimeDefault", "ignored",
                        f"unsupported field; podman's default filter is on anyway: /proc/1/status Seccomp "
                        f"{status['Seccomp'][0]} (2 = filter)", failed=status["Seccomp"][0] != "2"))
    for field in ("runAsNonRoot", "fsGroup"):
        if field in security:
            rows.append(Row(subject, f"securityContext.{field}", "ignored",
                            f"unsupported field; /proc/1/status Uid {status['Uid'][0]}, Groups {status.get('Groups', [])}"))
    resources = spec.get("resources", {})
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    if limits:
        cpus = host["CpuQuota"] / host["CpuPeriod"] if host["CpuPeriod"] else 0
        rows.append(Row(subject, f"resources.limits {limits}", "applied",
                        f"cgroup CPU quota {cpus:g} CPUs, memory {host['Memory'] / 2**30:g} GiB",
                        failed=not (cpus and host["Memory"])))
    seen = {"cpu": ("CpuShares", host.get("CpuShares")), "memory": ("MemoryReservation", host.get("MemoryReservation"))}
    for resource, quantity in requests.items():
        name, value = seen.get(resource, ("-", None))
        rows.append(Row(subject, f"resources.requests.{resource} {quantity}", "applied" if value else "ignored",
                        f"HostConfig.{name} {value}"))
    mounts = {m["Destination"]: m for m in data["Mounts"]}
    models = mounts.get("/mnt/models", {})
    rows.append(Row(subject, "volumeMounts /mnt/models readOnly", "applied" if models.get("RW") is False else "not applied",
                    f"{models.get('Type')} {models.get('Name') or models.get('Source')}, RW {models.get('RW')}",
                    failed=models.get("RW") is not False))
    return rows


def check_stop(ctr: Played, pod: str, subject: str, spec: dict[str, Any], grace: int) -> list[Row]:
    """``podman pod stop`` as the kubelet's pod deletion: how long readiness stays 200 (a preStop pause holds it for
    its length), podman's stop timeout against the pod's grace period, and the server's exit code."""
    stop_timeout = ctr.inspect()["Config"].get("StopTimeout")
    url = f"http://127.0.0.1:{ctr.port(8080)}/v2/health/ready"
    started = time.monotonic()
    stopper = threading.Thread(target=lambda: podman("pod", "stop", pod, check_rc=False, timeout=120))
    stopper.start()
    unready = None
    while unready is None and time.monotonic() - started < 20:
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status != 200:
                    unready = time.monotonic() - started
        except (urllib.error.URLError, OSError):
            unready = time.monotonic() - started
        time.sleep(0.05)
    stopper.join(timeout=130)
    exited = time.monotonic() - started
    state = ctr.state()
    rows = []
    command = spec.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    if command:  # the manifests' preStop is `sleep N`: readiness stays 200 for N s when podman runs it
        paused = unready is not None and command[0] == "sleep" and unready >= float(command[-1])
        rows.append(Row(subject, f"lifecycle.preStop `{' '.join(command)}`", "ran" if paused else "ignored",
                        f"readiness off {unready if unready is not None else float('nan'):.2f} s after `podman pod stop`"
                        + ("" if paused else ": SIGTERM came at once, with no preStop pause before it")))
    rows.append(Row(subject, f"terminationGracePeriodSeconds {grace}", "ignored" if stop_timeout != grace else "applied",
                    f"Config.StopTimeout {stop_timeout} s (SIGKILL after it)"))
    rows.append(Row(subject, "SIGTERM (`podman pod stop`)", "ran",
                    f"exit code {state['ExitCode']} {exited:.1f} s after the stop began",
                    failed=state["ExitCode"] != 0 or state["Running"]))
    return rows


def check_pod(pod: str, container: str, subject: str, spec: dict[str, Any], pod_spec: dict[str, Any],
              host_ports: dict[int, int], play_log: str, full: bool = True) -> list[Row]:
    """The checks of one played pod: serving and probes, and when ``full`` security and stop; a failed serving check
    is one failed row."""
    ctr = Played(pod_container(pod, container), host_ports)
    try:
        rows = check_serving(ctr, subject)
    except CheckFailed as failure:
        return [Row(subject, "the server answers", "no answer", str(failure)[-1500:].replace("\n", " "), failed=True)]
    rows += check_probes(ctr, subject, spec, play_log)
    if not full:
        return rows
    rows += check_security(ctr, subject, spec, pod_spec.get("securityContext", {}))
    rows += check_stop(ctr, pod, subject, spec, int(pod_spec.get("terminationGracePeriodSeconds", 30)))
    return rows


def pod_of(output: str) -> str:
    """The pod id that ``podman kube play`` printed."""
    match = re.search(r"Pod:\s*\n([0-9a-f]{12,})", output)
    check(match, f"no pod in the output of podman kube play:\n{output}")
    assert match is not None
    return match.group(1)


def play_deployment(image: str, work: Path, stack: ExitStack, component: str | None = None) -> list[Row]:
    """deploy/k8s/overlays/cpu (with one of deploy/k8s/components when given) played: the kinds podman refuses, the
    claim (filled), then the Deployment, and every check; with a component, its pod's serving and probes only."""
    suffix = f"kubeplay-{component or 'cpu'}-{os.getpid()}"
    work = work / (component or "cpu")
    work.mkdir()
    host_ports = {inside: free_port() for inside in (8080, 8081, 8002)}
    docs = kustomize_with_component(work, component) if component else kustomize(KUSTOMIZE / "overlays" / "cpu")
    played, dropped = for_podman(docs, image, suffix, host_ports)
    subject = f"deploy/k8s cpu + {component}" if component else "deploy/k8s cpu"
    rows: list[Row] = []
    for doc in [] if component else dropped:
        done = podman("kube", "play", str(write(work / f"{doc['kind']}.yaml", [doc])), check_rc=False)
        rows.append(Row(subject, f"kind {doc['kind']} ({doc['metadata']['name']})",
                        "refused" if done.returncode else "applied",
                        f"rc {done.returncode}: {done.stderr.strip()[-200:]}", failed=done.returncode == 0))
    for claim in [d for d in played if d["kind"] == "PersistentVolumeClaim"]:
        volume = claim["metadata"]["name"]
        stack.callback(podman, "volume", "rm", "--force", volume, check_rc=False)
        play(write(work / "claim.yaml", [claim]))
        tarball = work / "models.tar"
        with tarfile.open(tarball, "w") as tar:
            tar.add(repository(work / "claim"), arcname=".")
        podman("volume", "import", volume, str(tarball))
        if not component:
            rows.append(Row(subject, "kind PersistentVolumeClaim", "applied",
                            f"podman volume {volume}, filled with {', '.join(MODELS)} by `podman volume import`"))
    [deployment] = [d for d in played if d["kind"] == "Deployment"]
    path = write(work / "deployment.yaml", [deployment])
    stack.callback(podman, "kube", "play", "--down", str(path), check_rc=False, timeout=120)
    done = play(path)
    pod_spec = deployment["spec"]["template"]["spec"]
    [spec] = pod_spec["containers"]
    pod = pod_of(done.stdout)
    if component:
        rows += check_pod(pod, spec["name"], subject, spec, pod_spec, host_ports, done.stderr, full=False)
        podman("kube", "play", "--down", str(path), check_rc=False, timeout=120)
        return rows
    pods = podman("pod", "ps", "--quiet", "--filter", f"name={deployment['metadata']['name']}").stdout.split()
    rows.append(Row(subject, "kind Deployment (replicas set to 1)", "applied",
                    f"{len(pods)} pod {podman('pod', 'inspect', '--format', '{{.Name}}', pod).stdout.strip()}"))
    rows += [Row(subject, f"Deployment {field}", "ignored", f"unsupported field: {why}")
             for field, why in UNSUPPORTED.items() if field.split()[0] in deployment["spec"]]
    return rows + check_pod(pod, spec["name"], subject, spec, pod_spec, host_ports, done.stderr)


def play_runtime(image: str, work: Path, stack: ExitStack) -> list[Row]:
    """The ClusterServingRuntime's container in a Pod, played with ``simple`` at /mnt/models."""
    work.chmod(0o755)
    models = repository(work / "models")
    container, grace = runtime_container()
    host_ports = {inside: free_port() for inside in (8080, 8081, 8002)}
    pod = runtime_pod(container, image, f"kserve-v2-runtime-kubeplay-{os.getpid()}", models, host_ports)
    pod["spec"]["terminationGracePeriodSeconds"] = grace  # what KServe's pod has: Kubernetes' default
    path = write(work / "runtime-pod.yaml", [pod])
    stack.callback(podman, "kube", "play", "--down", str(path), check_rc=False, timeout=120)
    done = play(path)
    subject = "KServe runtime pod"
    rows = [Row(subject, "kind Pod (the runtime's container, models as a read-only hostPath)", "applied",
                f"pod {pod['metadata']['name']}")]
    return rows + check_pod(pod_of(done.stdout), container["name"], subject, pod["spec"]["containers"][0], pod["spec"],
                            host_ports, done.stderr)


def not_run_here() -> list[Row]:
    """What this host cannot play at all: the object-storage component's storage initializer."""
    return [Row("deploy/k8s object-storage component", "initContainers storage-initializer (kserve/storage-initializer)",
                "not run here", "podman plays initContainers, but the image is on a registry this host cannot reach; "
                "the s3:// repository itself is checked by `make image-check` and `make fleet-drill`")]


def table(rows: list[Row]) -> str:
    """The markdown table of every row."""
    lines = ["| manifest | field / kind | podman | evidence |", "|---|---|---|---|"]
    lines += [f"| {r.subject} | {r.field} | {r.outcome}{' (FAILED)' if r.failed else ''} | {r.evidence.replace('|', chr(92) + '|')} |"
              for r in rows]
    return "\n".join(lines)


def main() -> int:
    """Build (unless --image), play both pods, print the table; 0 when every check podman supports passed, 1 if not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="an image built already (skips the build, and is kept)")
    parser.add_argument("--base", default="localhost/kserve-v2-base:bookworm", help="local base image to make or reuse")
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds for the plays and checks (after the build)")
    options = parser.parse_args()
    os.environ.setdefault("CONTAINERS_CONF", str(DOCKER / "containers.conf"))
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGALRM, interrupted)
    started = time.monotonic()
    rows: list[Row] = []
    pause_before = podman("images", "--quiet", PAUSE).stdout.split()
    with tempfile.TemporaryDirectory(prefix="kserve-v2-kube-play.") as work_dir, ExitStack() as stack:  # stack first out
        work = Path(work_dir)
        if not pause_before:  # podman builds its pause image for the first pod; this run removes it when no pod uses it
            stack.callback(lambda: podman("rmi", *podman("images", "--quiet", PAUSE).stdout.split(), check_rc=False))
        try:
            image = options.image
            if image is None:
                built = build_runtime(stack, work, options.base, TAG)
                image = built.name
                print(f"kube-play: built {image} in {built.seconds:.0f} s", flush=True)
            signal.alarm(int(options.time_limit))
            rows += play_deployment(image, work, stack)
            rows += play_deployment(image, work, stack, "http-probes")
            rows += play_runtime(image, work, stack)
            rows += not_run_here()
        except (CheckFailed, subprocess.TimeoutExpired, KeyboardInterrupt, ValueError, KeyError) as failure:
            print(f"kube-play FAILED: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
            rows.append(Row("(aborted)", type(failure).__name__, "aborted", str(failure)[-1500:].replace("\n", " "),
                            failed=True))
        finally:
            signal.alarm(0)
            print(table(rows), flush=True)
    failed = [r for r in rows if r.failed]
    print(f"kube-play: {'FAILED' if failed else 'passed'} in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
