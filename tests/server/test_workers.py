"""--workers 2: two replicas behind the same ports answer as one server.

Each request below that must reach "every replica" goes over a fresh connection (``http_json`` opens
one per request), and the kernel spreads connections over the replicas' sockets (SO_REUSEPORT): 12
fresh connections all landing on one of two replicas happens once in 2,048 runs, and the first test
checks from the verbose log that both replicas served. A gRPC channel is one connection, so a
sequence over one channel stays on one replica.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from helpers import EXAMPLES, ROOT, Server, http_json, metrics_text, start_server, wait_until

FRESH = 12  # fresh connections that must all see a change
SIMPLE_BODY = {"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}


def _everywhere(server: Server, path: str, body: object = None) -> list[tuple[int, Any]]:
    return [http_json(server, path, body) for _ in range(FRESH)]


def _metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _replica_pids(server: Server) -> dict[int, int]:
    """The latest pid of each replica, from the supervisor's log."""
    return {int(i): int(p) for i, p in re.findall(r"replica (\d+) started \(pid (\d+)\)", server.log())}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = tmp_path_factory.mktemp("repo")
    for name in ("simple", "simple_identity", "simple_string_dyna_sequence"):
        shutil.copytree(EXAMPLES / name, repository / name)
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--workers", "2", "--model-control-mode",
                          "explicit", "--load-model", "simple", "--load-model", "simple_string_dyna_sequence",
                          "--allow-client-shm", "true", "--log-verbose", "1")
    yield server
    assert server.stop() == 0
    log = server.log()
    assert len(re.findall(r"\[replica \d\] kserve_v2.app: server stopped", log)) == 2, log[-3000:]
    assert log.rstrip().endswith("kserve_v2.workers.supervisor: server stopped"), log[-3000:]


def test_replicas_share_the_ports_and_count_as_one(workers: Server) -> None:
    before_stats = http_json(workers, "/v2/models/simple/stats")[1]["model_stats"][0]["inference_stats"]["success"]["count"]
    before = _metric(metrics_text(workers.metrics_port), "nv_inference_request_success", model="simple")
    outputs = [http_json(workers, "/v2/models/simple/infer", SIMPLE_BODY) for _ in range(30)]
    assert all(status == 200 and body["outputs"][0]["data"] == list(range(1, 17)) for status, body in outputs)
    served = set(re.findall(r"\[replica (\d)\] kserve_v2.service.inference_service: infer request for model 'simple'", workers.log()))
    assert served == {"0", "1"}  # the kernel spread the connections over both replicas
    with grpcclient.InferenceServerClient(workers.url) as client:
        stats = client.get_inference_statistics("simple").model_stats[0]
        assert stats.inference_stats.success.count - before_stats == 30  # the total over both replicas
        assert client.is_server_ready() and client.is_model_ready("simple")
    for port in (workers.metrics_port, workers.http_port):  # both /metrics give the sum, in the same families
        text = metrics_text(port)
        assert _metric(text, "nv_inference_request_success", model="simple", version="1") - before == 30
        assert _metric(text, "kserve_v2_replicas") == 2 and _metric(text, "kserve_v2_replica_restarts_total") == 0
        assert _metric(text, "nv_inference_request_latency_seconds_count", model="simple") - before == 30
    status = [http_json(workers, "/v2/health/ready")[0] for _ in range(FRESH)]
    assert status == [200] * FRESH
    with connect(f"ws://{workers.http_url}/ws/status") as ws:  # the status page's feed: every replica's
        snapshot = json.loads(ws.recv(timeout=30))
    [success] = [s["value"] for s in snapshot["counters"]["nv_inference_request_success"]
                 if s["labels"] == {"model": "simple", "version": "1"}]
    assert success == _metric(metrics_text(workers.metrics_port), "nv_inference_request_success", model="simple")
    simple = next(m for m in snapshot["models"] if m["name"] == "simple")
    assert simple["state"] == "loaded" and "simple" in snapshot["loaded_models"]


def test_model_control_reaches_every_replica_before_it_answers(workers: Server) -> None:
    with grpcclient.InferenceServerClient(workers.url) as client:
        client.load_model("simple_identity")
        assert all(s == 200 for s, _ in _everywhere(workers, "/v2/models/simple_identity/ready"))
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index["simple_identity"] == "READY"
        client.unload_model("simple_identity")
        assert all(s == 400 for s, _ in _everywhere(workers, "/v2/models/simple_identity/ready"))
        with pytest.raises(Exception, match="load failed for model 'simple_identity'"):
            client.load_model("simple_identity", config=json.dumps({"max_batch_size": -3}))
        rows = _everywhere(workers, "/v2/repository/index", {})
        states = {tuple(r.get("state", "") for r in body if r["name"] == "simple_identity") for _, body in rows}
        assert len(states) == 1 and "READY" not in next(iter(states))  # one answer, from every replica
        client.load_model("simple_identity")
    assert all(s == 200 for s, _ in _everywhere(workers, "/v2/models/simple_identity/ready"))


def test_shared_memory_and_trace_settings_reach_every_replica(workers: Server) -> None:
    key = f"/kv2_workers_{os.getpid()}"
    handle = shm.create_shared_memory_region("in", key, 128)
    try:
        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)])
        with grpcclient.InferenceServerClient(workers.url) as client:
            client.register_system_shared_memory("workers_in", key, 128)
            statuses = _everywhere(workers, "/v2/systemsharedmemory/status")
            assert all([r["name"] for r in body] == ["workers_in"] for _, body in statuses)
            body = {"inputs": [
                {"name": name, "shape": [1, 16], "datatype": "INT32",
                 "parameters": {"shared_memory_region": "workers_in", "shared_memory_byte_size": 64,
                                "shared_memory_offset": offset}} for name, offset in (("INPUT0", 0), ("INPUT1", 64))]}
            answers = _everywhere(workers, "/v2/models/simple/infer", body)
            assert all(s == 200 and b["outputs"][0]["data"] == list(range(1, 17)) for s, b in answers)
            client.unregister_system_shared_memory("workers_in")
            assert all(body == [] for _, body in _everywhere(workers, "/v2/systemsharedmemory/status"))
    finally:
        shm.destroy_shared_memory_region(handle)
    assert http_json(workers, "/v2/trace/setting", {"trace_rate": "7"})[0] == 200
    try:
        assert all(body["trace_rate"] == "7" for _, body in _everywhere(workers, "/v2/trace/setting"))
    finally:
        http_json(workers, "/v2/trace/setting", {"trace_rate": None})


def test_a_sequence_over_one_connection_stays_on_its_replica(workers: Server) -> None:
    """The model keeps a running sum in its sequence state: a request on the other replica would
    start from zero (or be refused without START)."""
    values = [20, -11, -7, -5, -3, -2, 0, -1]
    expected = [int(v) for v in np.cumsum(values)]
    for _ in range(3):  # a connection each: any of them on either replica
        with grpcclient.InferenceServerClient(workers.url) as client:  # one channel: one connection
            for sequence_id in ("7001", "7002"):
                got = []
                for i, value in enumerate(values):
                    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                    tensor.set_data_from_numpy(np.full([1, 1], value, np.int32))
                    result = client.infer("simple_string_dyna_sequence", [tensor], sequence_id=sequence_id,
                                          sequence_start=i == 0, sequence_end=i == len(values) - 1)
                    got.append(int(result.as_numpy("OUTPUT")[0][0]))
                assert got == expected[:-1] + [expected[-1] + int(sequence_id)]  # END adds the correlation id


def test_a_replica_that_dies_is_replaced_and_caught_up(tmp_path: Path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--workers", "2", "--model-control-mode", "explicit",
                          "--log-verbose", "1")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            client.load_model("simple")  # after the start: the replacement must replay it
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            client.infer("simple", inputs)
            wait_until(lambda: "infer request for model 'simple'" in server.log(), "a replica's debug line")
            mine = re.findall(r"\[replica (\d)\] kserve_v2.service.inference_service: infer request", server.log())[-1]
            victim = 1 - int(mine)
            errors: list[Exception] = []
            done = threading.Event()

            def keep_inferring() -> None:  # the connection of the replica that lives on
                while not done.is_set():
                    try:
                        client.infer("simple", inputs)
                    except Exception as err:  # noqa: BLE001 - counted
                        errors.append(err)

            thread = threading.Thread(target=keep_inferring)
            thread.start()
            os.kill(_replica_pids(server)[victim], signal.SIGKILL)
            wait_until(lambda: re.search(rf"replica {victim} \(pid \d+\) was killed by signal 9; starting a replacement",
                                         server.log()), "the killed replica replaced")
            wait_until(lambda: f"replica {victim} applied the 1 control calls it missed" in server.log(),
                       "the replacement caught up")
            wait_until(lambda: _metric(metrics_text(server.metrics_port), "kserve_v2_replicas") == 2, "two replicas again")
            done.set()
            thread.join(30)
            assert errors == []  # requests on the other replica went on
        text = metrics_text(server.metrics_port)
        assert _metric(text, "kserve_v2_replica_restarts_total") == 1
        assert all(s == 200 for s, _ in _everywhere(server, "/v2/models/simple/ready"))
        answers = _everywhere(server, "/v2/models/simple/infer", SIMPLE_BODY)
        assert all(s == 200 for s, _ in answers)
        assert len(set(re.findall(r"\[replica (\d)\] kserve_v2.service.inference_service", server.log()))) == 2
    finally:
        assert server.stop() == 0


def test_poll_mode_changes_reach_every_replica(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "simple", repository / "simple")
    server = start_server(repository, tmp_path / "logs", "--workers", "2", "--model-control-mode", "poll",
                          "--repository-poll-secs", "0.5")
    try:
        shutil.copytree(EXAMPLES / "simple_identity", repository / "simple_identity")
        wait_until(lambda: http_json(server, "/v2/models/simple_identity/ready")[0] == 200, "simple_identity ready")
        assert all(s == 200 for s, _ in _everywhere(server, "/v2/models/simple_identity/ready"))
        shutil.rmtree(repository / "simple_identity")
        wait_until(lambda: http_json(server, "/v2/models/simple_identity/ready")[0] != 200, "simple_identity gone")
        assert all(s != 200 for s, _ in _everywhere(server, "/v2/models/simple_identity/ready"))
        assert server.log().count("poll: model folder 'simple_identity' appeared") == 1  # replica 0 polls for both
    finally:
        assert server.stop() == 0


def test_replicas_leave_when_the_supervisor_dies(tmp_path: Path) -> None:
    """Replicas whose supervisor was killed drain and exit: no orphan keeps the ports."""
    server = start_server(EXAMPLES, tmp_path, "--workers", "2")
    pids = _replica_pids(server)
    server.proc.kill()
    server.proc.wait(30)

    def gone() -> bool:
        for pid in pids.values():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                continue  # exited; its parent (gone) left it to be reaped
            return False
        return True

    wait_until(gone, "every replica gone")
    assert server.log().count("the supervisor has gone: shutting this replica down") == 2


@pytest.mark.parametrize("value", ["0", "many"])
def test_workers_flag_refuses_what_it_cannot_run(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(EXAMPLES),
                           "--workers", value], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--workers" in done.stderr
