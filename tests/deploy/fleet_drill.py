"""`make fleet-drill`: three replicas of the CPU image behind HAProxy, one ``s3://`` repository, and the faults an
operator lives through, measured under a steady load (issue 53; the runbook is docs/deploy.md, "Fleet drill").

Builds the Dockerfile's ``runtime`` target as `make image-check` does (tests/deploy/image_check.py), starts moto's
S3 server on this host with examples/model_repository's ``simple`` and ``add_sub_process`` (the examples' python
add/sub model in stub process mode, slow when INPUT0 holds a negative number) under one prefix, three replicas of
the image as the KServe runtime runs them (fleet_replicas.py) in poll mode on that prefix, HAProxy in front of them
(fleet_balancer.py), and gRPC and REST callers of ``simple`` through HAProxy (fleet_load.py). Then the drills, each
after a steady phase, each reporting requests sent and failed (with the distinct errors) and p50/p99 during the
drill against the steady phase before it:

1. rolling restart: ``podman stop -t 30`` (SIGTERM) one replica at a time, start it again, wait until ready; (a) as
   a pod without a preStop pause has it (the fault, shown; not a target), (b) as deploy/k8s's Deployment and the
   KServe runtime have it (the replica out of the balancer, as out of the Service's endpoints, for the preStop pause
   first);
2. a new version of ``simple`` uploaded: every replica serves it within two poll periods (asked directly);
3. a broken version (a model file that is not ONNX) uploaded: every replica serves the last good version and says
   why in the repository index and its log; the broken version is then deleted;
4. the bucket unreachable for 30 s (moto SIGSTOPped, then SIGCONTed): serving goes on, and a version uploaded
   afterwards is served by every replica within two poll periods;
5. one replica SIGKILLed (``podman kill -s KILL``): failed requests <= requests in flight then; it is started again;
6. ``add_sub_process``'s stub process SIGKILLed (found from this host with psutil) while a slow request runs in it:
   that request fails, the next one succeeds;
7. a soak of ``--soak-seconds`` with ``simple``'s config re-uploaded every 30 s (a reload on every replica): RSS
   and open file descriptors of each replica's server process after the first reload against the end.

Targets (issue 53): drills 1-4 no failed request and p99 <= 3x the steady p99; drill 5 failed <= in flight; drill 6
exactly one failed request; soak RSS growth <= 10% and open file descriptors within +-2; after every drill, every
replica ready again within two poll periods. Prints a markdown table of every drill, then HAProxy's server state
changes and the replicas' log tails when a target is missed, and exits 1 then. Everything listens on 127.0.0.1;
every container and process is removed at exit (Ctrl-C and SIGTERM included), and the whole run is bound by
``--time-limit``. ``--short`` is CI's form (a 120 s soak, shorter steady phases). Needs root, podman and haproxy
(deploy/docker/fleet_host.sh installs them).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from deploy_support import KUSTOMIZE, load  # noqa: E402
from fleet_balancer import Backend, HAProxy  # noqa: E402
from fleet_load import Load, Summary, one_line, summarize  # noqa: E402
from fleet_replicas import Replica, replica_args  # noqa: E402
from helpers import EXAMPLES  # noqa: E402
from image_check import DOCKER, CheckFailed, build_runtime, free_port, podman  # noqa: E402
from s3_store import MotoS3  # noqa: E402

TAG = "localhost/kserve-v2-fleet:runtime"
BUCKET, PREFIX = "models", "fleet"
REPLICAS = 3
PYTHON_MODEL = "add_sub_process"
SLOW_SECONDS = 4.0  # add_sub_process's execute when INPUT0 holds a negative number
OUTAGE_SECONDS = 30.0
RELOAD_SECONDS = 30.0
P99_FACTOR, RSS_GROWTH, FD_DRIFT = 3.0, 0.10, 2
PYTHON_CONFIG = f"""name: "{PYTHON_MODEL}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
instance_group [{{ kind: KIND_CPU count: 1 }}]
parameters {{ key: "EXECUTION_MODE" value: {{ string_value: "process" }} }}
"""
SLOW_HOOK = f"""
import time

_add_sub = TritonPythonModel.execute


def _execute(self, requests):
    if any((pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() < 0).any() for r in requests):
        time.sleep({SLOW_SECONDS})  # the drill's slow request: the stub is killed while it sleeps
    return _add_sub(self, requests)


TritonPythonModel.execute = _execute
"""


@dataclass
class Drill:
    """A drill's report: its steady phase and itself, what it checked (notes), the targets it missed."""

    name: str
    steady: Summary
    during: Summary
    notes: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)


class Fleet:
    """The bucket, the replicas, the balancer and the load: what every drill acts on."""

    def __init__(self, store: MotoS3, replicas: list[Replica], balancer: HAProxy, load: Load, poll_secs: float,
                 steady: float) -> None:
        self.store, self.replicas, self.balancer, self.load = store, replicas, balancer, load
        self.poll_secs, self.steady_secs = poll_secs, steady

    def put(self, key: str, body: bytes) -> None:
        """Upload ``body`` as ``key`` under the repository's prefix."""
        self.store.s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=body)

    def delete(self, key: str) -> None:
        """Delete ``key`` under the repository's prefix."""
        self.store.s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}")

    def upload_version(self, version: int) -> float:
        """``simple``'s model file as a new version; the time.monotonic() of the upload's end."""
        self.put(f"simple/{version}/model.onnx", (EXAMPLES / "simple" / "1" / "model.onnx").read_bytes())
        return time.monotonic()

    def wait_version(self, version: int, since: float, drill: Drill, budget: float = 60) -> None:
        """Wait until every replica (asked directly) serves ``simple`` version ``version``; notes the slowest
        time since ``since`` and misses the target when it is over two poll periods."""
        waiting = set(range(len(self.replicas)))
        seconds: dict[int, float] = {}
        while waiting and time.monotonic() - since < budget:
            for i in sorted(waiting):
                if self.replicas[i].version_ready("simple", str(version)):
                    seconds[i] = time.monotonic() - since
                    waiting.discard(i)
            time.sleep(0.05)
        slowest = max(seconds.values(), default=budget)
        drill.notes.append(f"v{version} served by {len(seconds)}/{len(self.replicas)} replicas, the last after "
                           f"{slowest:.1f} s (bound {2 * self.poll_secs:g} s)")
        if waiting or slowest > 2 * self.poll_secs:
            drill.missed.append(f"simple v{version} not served by every replica within two poll periods")

    def check_ready(self, drill: Drill) -> None:
        """Every replica is ready again within two poll periods after a drill; misses the target (with the
        replica's index rows of its unready models) for each one that is not."""
        deadline = time.monotonic() + 2 * self.poll_secs
        while time.monotonic() < deadline and not all(r.get("/v2/health/ready")[0] == 200 for r in self.replicas):
            time.sleep(0.1)
        for replica in self.replicas:
            if replica.get("/v2/health/ready")[0] != 200:
                try:
                    rows: list[object] = [(e.get("name"), e.get("version"), e.get("state"), e.get("reason"))
                                          for e in replica.index() if e.get("state") != "READY"]
                except CheckFailed as failure:
                    rows = [str(failure)]
                drill.missed.append(f"{replica.name} not ready {2 * self.poll_secs:g} s after the drill; index: {rows}")

    @contextmanager
    def drill(self, name: str, drills: list[Drill], gated: bool) -> Iterator[Drill]:
        """A steady phase, then the block (the drill); appends its report to ``drills``. A check that fails in the
        block misses the target, and so, when ``gated``, do failed requests and a p99 over P99_FACTOR x the steady
        p99; every replica must be ready again afterwards (``check_ready``)."""
        time.sleep(self.steady_secs)
        start = time.monotonic()
        steady = summarize(self.load.window(start - self.steady_secs, start))
        print(f"fleet-drill: {name} ...", flush=True)
        report = Drill(name, steady, steady)
        try:
            yield report
        except (CheckFailed, RuntimeError, OSError, subprocess.TimeoutExpired) as failure:  # the next drill still runs
            report.missed.append(f"{type(failure).__name__}: {one_line(str(failure), 500)}")
        report.during = summarize(self.load.window(start, time.monotonic()))
        self.check_ready(report)
        if gated and report.during.failed:
            report.missed.append(f"{report.during.failed} failed requests")
        if gated and report.during.p99_ms > P99_FACTOR * max(steady.p99_ms, 1.0):
            report.missed.append(f"p99 {report.during.p99_ms:.0f} ms > {P99_FACTOR:g}x steady {steady.p99_ms:.0f} ms")
        drills.append(report)


def python_model(target: Path) -> Path:
    """``add_sub_process``: examples' simple_python model.py in stub process mode, slow on a negative INPUT0."""
    folder = target / PYTHON_MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PYTHON_CONFIG)
    source = (EXAMPLES / "simple_python" / "1" / "model.py").read_text()
    (folder / "1" / "model.py").write_text(source + SLOW_HOOK)
    return folder


def pre_stop_seconds() -> float:
    """The preStop pause of deploy/k8s's Deployment (``sleep N``), seconds."""
    [deployment] = load(KUSTOMIZE / "base" / "deployment.yaml")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    return float(command[-1])


def rolling_restart(fleet: Fleet, drill: Drill, pre_stop: float | None) -> None:
    """Drill 1: SIGTERM (podman stop -t 30), start, ready, one replica after the other. With ``pre_stop`` (seconds),
    first what the kubelet and the endpoints controller do for deploy/k8s's Deployment: the replica out of the
    balancer (as out of the Service's endpoints), then the preStop pause; it is put back after its restart."""
    for index, replica in enumerate(fleet.replicas):
        if pre_stop is not None:
            fleet.balancer.set_state(index, "maint")
            time.sleep(pre_stop)
        stop = time.monotonic()
        podman("stop", "--time=30", replica.name, timeout=90)
        stopped = time.monotonic() - stop
        exit_code = replica.container.state()["ExitCode"]
        replica.start()
        ready = replica.wait_ready()
        if pre_stop is not None:
            fleet.balancer.set_state(index, "ready")
        time.sleep(1.5)  # HAProxy's rise: two checks 500 ms apart, as a rollout waits for the new pod's readiness
        drill.notes.append(f"{replica.name[-5:]}: exit {exit_code} {stopped:.1f} s after SIGTERM, ready {ready:.1f} s")
        if exit_code != 0:
            drill.missed.append(f"{replica.name} exited {exit_code} on SIGTERM")


def broken_version(fleet: Fleet, drill: Drill) -> None:
    """Drill 3: simple/3/model.onnx that is not ONNX; v2 serves on, the index and the log say why; then deleted."""
    fleet.put("simple/3/model.onnx", b"this is not an ONNX model")
    time.sleep(3 * fleet.poll_secs)
    for replica in fleet.replicas:
        simple = [e for e in replica.index() if e.get("name") == "simple"]
        reasons = sorted({str(e.get("reason")) for e in simple if e.get("reason")})
        serving = replica.version_ready("simple", "2")
        log = replica.log()
        said = bool(reasons) and all(reason in log for reason in reasons)
        rows = [(e.get("version"), e.get("state")) for e in simple]
        drill.notes.append(f"{replica.name[-5:]}: v2 ready {serving}; index {rows} reason {reasons[:1]}; "
                           f"the log says it: {said}")
        if not serving:
            drill.missed.append(f"{replica.name}: simple v2 not ready after a broken v3")
        if not said:
            drill.missed.append(f"{replica.name}: the index and the log do not both say why the version failed")
    fleet.delete("simple/3/model.onnx")
    time.sleep(2 * fleet.poll_secs)


def bucket_outage(fleet: Fleet, drill: Drill) -> None:
    """Drill 4: moto SIGSTOPped for OUTAGE_SECONDS, then SIGCONTed; v4 uploaded afterwards must be served."""
    fleet.store.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(OUTAGE_SECONDS)
    finally:
        fleet.store.proc.send_signal(signal.SIGCONT)
    ready = sum(r.get("/v2/health/ready")[0] == 200 for r in fleet.replicas)
    kept = [r.log().count("keeping the last listing") for r in fleet.replicas]
    drill.notes.append(f"{ready}/{len(fleet.replicas)} replicas ready at the end of the {OUTAGE_SECONDS:g} s outage; "
                       f"'keeping the last listing' logged {kept} times")
    fleet.wait_version(4, fleet.upload_version(4), drill)


def replica_killed(fleet: Fleet, drill: Drill) -> None:
    """Drill 5: SIGKILL the second replica; failed requests <= in flight at the kill; then start it again."""
    replica = fleet.replicas[1]
    in_flight = fleet.load.in_flight()
    kill = time.monotonic()
    podman("kill", "--signal=KILL", replica.name)
    time.sleep(2)
    down = sorted(server for server, status in fleet.balancer.states().items() if status != "UP")
    drill.notes.append(f"2 s after the kill, HAProxy has {down or 'none'} out")
    time.sleep(3)
    failures = [o for o in fleet.load.window(kill, time.monotonic()) if o.error]
    last = max((o.start - kill for o in failures), default=0.0)
    drill.notes.append(f"{len(failures)} failed, {in_flight} in flight (all replicas) at the kill; the last failed "
                       f"request started {last:.2f} s after it")
    if len(failures) > in_flight:
        drill.missed.append(f"{len(failures)} failed requests > {in_flight} in flight at the kill")
    replica.start()
    drill.notes.append(f"restarted, ready after {replica.wait_ready():.1f} s")
    time.sleep(1.5)


def stub_killed(fleet: Fleet, drill: Drill) -> None:
    """Drill 6: SIGKILL add_sub_process's stub on the first replica with a slow request in it; the next succeeds."""
    replica = fleet.replicas[0]
    results: list[str | None] = []

    def call(values: np.ndarray) -> None:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{replica.grpc}") as client:
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(values)
            inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
            try:
                client.infer(PYTHON_MODEL, inputs, client_timeout=60)
                results.append(None)
            except Exception as failure:  # the outcome to report, whatever its type
                results.append(one_line(str(failure)))

    call(np.zeros((1, 16), dtype=np.int32))  # the stub is up and warm
    slow = threading.Thread(target=call, args=(-np.ones((1, 16), dtype=np.int32),))
    slow.start()
    time.sleep(1.0)  # the slow request is inside execute, in the stub
    stub = replica.stub(PYTHON_MODEL)
    stub.kill()
    slow.join(timeout=60)
    call(np.zeros((1, 16), dtype=np.int32))
    failed = sum(r is not None for r in results)
    drill.notes.append(f"stub pid {stub.pid} SIGKILLed; warm-up, slow, next: {results}")
    if results[0] is not None or results[1] is None or results[2] is not None:
        drill.missed.append(f"expected exactly the slow request to fail, got {failed} failed of {results}")


def soak(fleet: Fleet, drill: Drill, seconds: float) -> None:
    """Drill 7: ``seconds`` of load with simple's config re-uploaded every RELOAD_SECONDS; RSS and fds per replica
    after the first reload against the end."""
    config = (EXAMPLES / "simple" / "config.pbtxt").read_text()
    start = time.monotonic()
    warm: list[tuple[int, int]] = []
    reloads = 0
    while time.monotonic() - start < seconds:
        reloads += 1
        fleet.put("simple/config.pbtxt", f"{config}\n# soak reload {reloads}\n".encode())
        time.sleep(min(RELOAD_SECONDS, max(0.0, seconds - (time.monotonic() - start))))
        if not warm:
            warm = [r.usage() for r in fleet.replicas]
    end = [r.usage() for r in fleet.replicas]
    drill.notes.append(f"{reloads} reloads")
    for replica, (rss0, fds0), (rss1, fds1) in zip(fleet.replicas, warm, end, strict=True):
        growth = (rss1 - rss0) / rss0
        drill.notes.append(f"{replica.name[-5:]}: RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB ({growth:+.1%}), "
                           f"fds {fds0} -> {fds1}")
        if growth > RSS_GROWTH:
            drill.missed.append(f"{replica.name}: RSS grew {growth:.1%} > {RSS_GROWTH:.0%}")
        if abs(fds1 - fds0) > FD_DRIFT:
            drill.missed.append(f"{replica.name}: open fds {fds0} -> {fds1}")


def table(drills: list[Drill]) -> str:
    """The markdown table of every drill."""
    lines = ["| drill | sent | failed | p50 ms steady / during | p99 ms steady / during | errors | checked | target |",
             "|---|---|---|---|---|---|---|---|"]
    for d in drills:
        errors = "; ".join(f"{count}x {text}" for text, count in d.during.errors.items()) or "-"
        target = "missed: " + "; ".join(d.missed) if d.missed else "met"
        lines.append(f"| {d.name} | {d.during.sent} | {d.during.failed} | {d.steady.p50_ms:.1f} / {d.during.p50_ms:.1f} "
                     f"| {d.steady.p99_ms:.1f} / {d.during.p99_ms:.1f} | {errors} | {'<br>'.join(d.notes)} | {target} |")
    return "\n".join(lines)


def run_drills(fleet: Fleet, soak_seconds: float, only: set[str] | None) -> list[Drill]:
    """Every drill in order (those whose number is in ``only`` when given), each after a steady phase."""
    drills: list[Drill] = []
    pre_stop = pre_stop_seconds()
    steps: list[tuple[str, bool, Callable[[Drill], None]]] = [
        ("1a rolling restart: SIGTERM with no preStop (the fault, shown: not a target)", False,
         lambda d: rolling_restart(fleet, d, None)),
        (f"1b rolling restart: out of the endpoints, preStop {pre_stop:g} s, SIGTERM (deploy/k8s, the KServe runtime)",
         True,
         lambda d: rolling_restart(fleet, d, pre_stop)),
        ("2 new version", True, lambda d: fleet.wait_version(2, fleet.upload_version(2), d)),
        ("3 broken version", True, lambda d: broken_version(fleet, d)),
        (f"4 bucket unreachable {OUTAGE_SECONDS:g} s", True, lambda d: bucket_outage(fleet, d)),
        ("5 replica SIGKILLed", False, lambda d: replica_killed(fleet, d)),
        ("6 python stub SIGKILLed", False, lambda d: stub_killed(fleet, d)),
        (f"7 soak {soak_seconds:g} s, reload every {RELOAD_SECONDS:g} s", False, lambda d: soak(fleet, d, soak_seconds)),
    ]
    for name, gated, step in steps:
        if only is not None and name[0] not in only:
            continue
        with fleet.drill(name, drills, gated) as drill:
            step(drill)
    return drills


def interrupted(signum: int, frame: FrameType | None) -> None:
    """SIGTERM and SIGALRM (the time limit) unwind like Ctrl-C, so that every container and process is removed."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main() -> int:
    """Build, start the fleet, run every drill, print the table; 0 when every target is met, 1 if not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI's form: a 120 s soak, 5 s steady phases")
    parser.add_argument("--soak-seconds", type=float, help="soak length (default 900, 120 with --short)")
    parser.add_argument("--poll-secs", type=float, default=2.0, help="the replicas' --repository-poll-secs")
    parser.add_argument("--callers", type=int, default=2, help="gRPC callers, and as many REST callers")
    parser.add_argument("--time-limit", type=float, help="seconds for the whole run (default: 600 with --short)")
    parser.add_argument("--base", default="localhost/kserve-v2-base:bookworm", help="local base image to make or reuse")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="one more server flag for every replica (after the runtime's args; repeatable)")
    parser.add_argument("--only", help="the drills to run, by number (e.g. 56); default all")
    parser.add_argument("--image", help="an image built already (skips the build, and is kept)")
    options = parser.parse_args()
    soak_seconds = options.soak_seconds or (120.0 if options.short else 900.0)
    steady = 5.0 if options.short else 15.0
    limit = options.time_limit or (600.0 if options.short else soak_seconds + 900.0)
    os.environ.setdefault("CONTAINERS_CONF", str(DOCKER / "containers.conf"))
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGALRM, interrupted)
    signal.alarm(int(limit))
    started = time.monotonic()
    replicas: list[Replica] = []
    drills: list[Drill] = []
    balancer: HAProxy | None = None
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="kserve-v2-fleet-drill.") as work_dir:
        work = Path(work_dir)
        try:
            image = options.image
            if image is None:
                built = build_runtime(stack, work, options.base, TAG)
                image = built.name
                print(f"fleet-drill: built {image} in {built.seconds:.0f} s", flush=True)
            store = stack.enter_context(MotoS3(work / "moto.log"))
            store.upload(EXAMPLES / "simple", BUCKET, f"{PREFIX}/simple")
            store.upload(python_model(work / "python"), BUCKET, f"{PREFIX}/{PYTHON_MODEL}")
            args = [*replica_args(store.url(BUCKET, PREFIX), options.poll_secs), *options.server_arg]
            for _ in range(REPLICAS):
                replicas.append(Replica(image, args, store.credentials()))
                stack.callback(replicas[-1].remove)
            cold = [replica.wait_ready() for replica in replicas]
            print(f"fleet-drill: {REPLICAS} replicas ready after {max(cold):.1f} s", flush=True)
            rest_port, grpc_port = free_port(), free_port()
            balancer = stack.enter_context(HAProxy(work, rest_port, grpc_port, [Backend(r.http, r.grpc) for r in replicas]))
            time.sleep(1.5)  # the first health checks
            load = Load(grpc_port, rest_port, options.callers, pause=0.02, max_requests=10**6, max_seconds=limit)
            load.start()
            stack.callback(load.stop)
            drills = run_drills(Fleet(store, replicas, balancer, load, options.poll_secs, steady), soak_seconds,
                                set(options.only) if options.only else None)
        except (CheckFailed, RuntimeError, subprocess.TimeoutExpired, KeyboardInterrupt) as failure:
            print(f"fleet-drill FAILED: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
            drills.append(Drill("(aborted)", summarize([]), summarize([]), missed=[str(failure)[:500]]))
        finally:
            signal.alarm(0)
            print(table(drills), flush=True)
            if any(d.missed for d in drills):
                if balancer is not None:
                    print("\n--- HAProxy: servers' state changes ---\n" + "\n".join(balancer.events()[-80:]), flush=True)
                for replica in replicas:
                    print(f"\n--- {replica.name}: log tail ---\n{replica.log()[-3000:]}", flush=True)
    print(f"fleet-drill: {'FAILED' if any(d.missed for d in drills) else 'passed'} in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return 1 if any(d.missed for d in drills) else 0


if __name__ == "__main__":
    sys.exit(main())
