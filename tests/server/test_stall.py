"""One heavy request does not stall the others: while a large JSON body or a flood of
BYTES elements is decoded, a second client on the other transport keeps getting answers.

Before, decoding ran on the event loop both transports share: a 66 MB JSON body stalled every call
for 11.7 s. The bound here is relative to the attack's own duration (the machine may be slow):
the longest probe must take well under it, and probes must keep completing while it runs. The
probes come from a process of their own, so this process's work on the attack cannot delay them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import EXAMPLES, add_model, identity_model, make_model, start_server, wait_until

MAX_BODY = 16 * 2**20


def _config(datatype: str) -> str:
    return ("max_batch_size: 0\ninstance_group [{ count: 1, kind: KIND_CPU }]\n"
            f'input [{{ name: "INPUT0", data_type: {datatype}, dims: [-1] }}]\n'
            f'output [{{ name: "OUTPUT0", data_type: {datatype}, dims: [-1] }}]\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    (repository / "simple").symlink_to(EXAMPLES / "simple")
    add_model(repository, "identity_fp32", identity_model(TensorProto.FLOAT, [None]), _config("TYPE_FP32"))
    add_model(repository, "identity_bytes", identity_model(TensorProto.STRING, [None]), _config("TYPE_STRING"))
    pair = make_model([helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in (0, 1)],
                      [(f"INPUT{i}", TensorProto.FLOAT, [None]) for i in (0, 1)],
                      [(f"OUTPUT{i}", TensorProto.FLOAT, [None]) for i in (0, 1)])
    add_model(repository, "pair_fp32", pair, "max_batch_size: 0\n" + "".join(
        f'input [{{ name: "INPUT{i}", data_type: TYPE_FP32, dims: [-1] }}]\n'
        f'output [{{ name: "OUTPUT{i}", data_type: TYPE_FP32, dims: [-1] }}]\n' for i in (0, 1)))
    running = start_server(repository, tmp_path_factory.mktemp("logs"), "--http-max-input-size", str(MAX_BODY),
                           "--max-request-decoded-bytes", str(200 * 2**20), "--request-memory-pool-bytes",
                           str(400 * 2**20))
    yield running
    assert running.stop() == 0


# A second client in its own process (so this process's GIL, busy with the attack's encoding and
# decoding, cannot delay it): an is_server_live and an infer of `simple` per probe, each probe's
# seconds printed, until its standard input closes.
PROBE = """
import sys, threading, time
import numpy as np
import tritonclient.{module} as triton
client = triton.InferenceServerClient(sys.argv[1])
inputs = [triton.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
for tensor in inputs:
    tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
client.infer("simple", inputs)
print("ready", flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    started = time.monotonic()
    client.is_server_live()
    client.infer("simple", inputs)
    print(time.monotonic() - started, flush=True)
    time.sleep(0.02)
"""


def _probe_while(attack: Callable[[], object], module: str, url: str) -> tuple[float, list[float], object]:
    """Run ``attack`` while a probe process (tritonclient ``module`` against ``url``) keeps calling the
    server. Returns (attack seconds, probe latencies, the attack's result)."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE.format(module=module), url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout.readline() == "ready\n"
        started = time.monotonic()
        outcome = attack()
        duration = time.monotonic() - started
    finally:
        out, _ = probe.communicate("", timeout=120)
    assert probe.returncode == 0, out
    return duration, [float(line) for line in out.split()], outcome


def test_a_large_json_body_does_not_stall_grpc(server) -> None:
    count = (MAX_BODY - 400) // 4
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": []}]}).encode()
    body = header.replace(b'"data": []', b'"data": [' + b"0.5," * (count - 1) + b"0.5]")
    assert len(body) <= MAX_BODY

    def attack() -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/infer", data=body)
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, response.read()

    duration, latencies, (status, content) = _probe_while(attack, "grpc", server.url)
    assert status == 200
    # parsed after the probes: json.loads of the 64 MB answer holds this process's GIL, which would
    # delay the probe thread and count as a server stall
    answer = json.loads(content)
    assert answer["outputs"][0]["data"][:2] == [0.5, 0.5] and len(answer["outputs"][0]["data"]) == count
    assert len(latencies) >= 5 and max(latencies) < duration * 0.3, (duration, max(latencies), len(latencies), sorted(latencies)[-5:])


def test_a_bytes_flood_does_not_stall_rest(server) -> None:
    count = 1_000_000
    tensor = grpcclient.InferInput("INPUT0", [count], "BYTES")
    tensor.set_data_from_numpy(np.array([b""] * count, dtype=object))
    client = grpcclient.InferenceServerClient(server.url)

    def attack() -> grpcclient.InferResult:
        return client.infer("identity_bytes", [tensor], client_timeout=600)

    duration, latencies, outcome = _probe_while(attack, "http", server.http_url)
    assert len(outcome.as_numpy("OUTPUT0")) == count  # decoded after the probes: it holds this process's GIL
    assert len(latencies) >= 5 and max(latencies) < duration * 0.3, (duration, max(latencies), len(latencies), sorted(latencies)[-5:])


def test_a_request_over_the_memory_limit_is_resource_exhausted(server) -> None:
    """2,000,000 BYTES elements cost ~280 MB decoded, over the 200 MiB limit this server runs with."""
    count = 2_000_000
    tensor = grpcclient.InferInput("INPUT0", [count], "BYTES")
    tensor.set_data_from_numpy(np.array([b""] * count, dtype=object))
    with pytest.raises(InferenceServerException) as err:
        grpcclient.InferenceServerClient(server.url).infer("identity_bytes", [tensor], client_timeout=120)
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "--max-request-decoded-bytes" in err.value.message()


def test_errors_from_the_json_worker_process_keep_their_status(server) -> None:
    """A 2 MB body parsed in the worker process: malformed JSON is still 400 with its message."""
    body = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [500000], "data": [' + b"0.5," * 500_000 + b"]}"
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/infer", data=body)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=120)
    assert err.value.code == 400 and "malformed JSON" in json.loads(err.value.read())["error"]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(child) for child in f.read().split())
    return found


def _dead(pid: int) -> bool:
    """Whether a process has ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_killed_json_worker_is_replaced(server) -> None:
    """The worker process that parses large JSON bodies dies (as under the OOM killer): the next body works."""
    count = 300_000
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": [0.5] * count}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()

    def post() -> int:
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/infer", data=body)
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status

    assert post() == 200  # the worker exists now
    workers = _children(server.proc.pid)
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(_dead(pid) for pid in workers), "the killed workers to be dead")
    assert post() == 200
    assert server.proc.poll() is None


def test_a_large_json_header_with_binary_data_both_ways(server) -> None:
    """A JSON header over 1 MiB is parsed in the worker process while another input is binary data,
    and a JSON output over 1 MiB is rendered there while another output goes back binary: the
    binary parts cross the process boundary whole."""
    count = 300_000
    values = np.arange(count, dtype=np.float32) / 4  # exact in float32 and in short JSON text
    binary = np.arange(1000, dtype=np.float32) - 0.5
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count], "data": values.tolist()},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [1000],
                    "parameters": {"binary_data_size": binary.nbytes}}],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {"binary_data": True}}]}).encode()
    assert len(header) > 2**20
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/pair_fp32/infer",
                                     data=header + binary.tobytes(),
                                     headers={"Inference-Header-Content-Length": str(len(header))})
    with urllib.request.urlopen(request, timeout=120) as response:
        length = int(response.headers["Inference-Header-Content-Length"])
        body = response.read()
    answer = json.loads(body[:length])
    assert [o["name"] for o in answer["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert np.array_equal(np.array(answer["outputs"][0]["data"], np.float32), values)
    assert answer["outputs"][1]["parameters"]["binary_data_size"] == binary.nbytes
    assert np.array_equal(np.frombuffer(body[length:], np.float32), binary)
