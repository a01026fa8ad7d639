"""Model control: explicit mode (load, reload, overrides, unload), poll mode, storms and memory."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import add_model, http_request, make_model, matmul_model, start_server, timed_matmul_model, wait_admitted


def scale_model(factor: float):
    """OUTPUT0 = INPUT0 * factor on FP32 [batch, 4]: tells loads apart."""
    const = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [], [factor]))
    return make_model([const, helper.make_node("Mul", ["INPUT0", "k"], ["OUTPUT0"])],
                      [("INPUT0", TensorProto.FLOAT, [None, 4])], [("OUTPUT0", TensorProto.FLOAT, [None, 4])])


def infer(client, model: str, rows: int = 1) -> np.ndarray:
    tensor = grpcclient.InferInput("INPUT0", [rows, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 4), np.float32))
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    add_model(repo, "scale", scale_model(2.0))
    add_model(repo, "other", scale_model(3.0))
    add_model(repo, "broken", b"not onnx")
    return repo


@pytest.fixture
def explicit(repository: Path, tmp_path: Path):
    server = start_server(repository, tmp_path / "logs", "--model-control-mode", "explicit", "--load-model", "other")
    with grpcclient.InferenceServerClient(server.url) as client:
        yield server, client
    assert server.stop() == 0


def test_explicit_index_load_unload(explicit) -> None:
    server, client = explicit
    assert client.is_server_ready()  # readiness: the models asked for (--load-model), none other yet
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert set(index) == {"scale", "other", "broken"}
    assert index["scale"].state == "" and index["scale"].version == ""  # never loaded: name only
    assert index["other"].state == "READY"
    assert not client.is_model_ready("scale")
    client.load_model("scale")
    assert client.is_model_ready("scale") and infer(client, "scale")[0, 0] == 2.0
    client.unload_model("scale")
    assert not client.is_model_ready("scale")
    row = [m for m in client.get_model_repository_index().models if m.name == "scale"][0]
    assert (row.version, row.state, row.reason) == ("1", "UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException) as err:
        infer(client, "scale")
    assert "has no available versions" in err.value.message()
    client.unload_model("scale")  # unloading an unloaded model succeeds
    client.unload_model("other", unload_dependents=False)
    assert client.is_server_ready()  # a model unloaded on purpose does not make the server unready
    client.load_model("scale")
    assert infer(client, "scale")[0, 0] == 2.0
    assert "unloaded model 'scale'" in server.log() and "RSS" in server.log()


def test_load_errors(explicit) -> None:
    _, client = explicit
    for name, text, status in (("wrong_model_name", "failed to load 'wrong_model_name'", "INTERNAL"),
                               ("broken", "load failed for model 'broken': version 1 is at UNAVAILABLE state:",
                                "INVALID_ARGUMENT")):
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert text in err.value.message() and err.value.status() == f"StatusCode.{status}"
    with pytest.raises(InferenceServerException) as err:  # Triton parses the override while it polls the model
        client.load_model("scale", config="{not json")
    assert (err.value.status(), err.value.message()) == ("StatusCode.INTERNAL", POLL_FAILED.format("scale"))
    with grpc.insecure_channel(explicit[0].url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.RepositoryModelLoadRequest(model_name="scale")
        request.parameters["priority"].int64_param = 1
        with pytest.raises(grpc.RpcError) as rpc:
            stub.RepositoryModelLoad(request)
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Unrecognized load parameter 'priority' with type 'int64'" in rpc.value.details()
        # KServe's proto puts the model name in field 1
        stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(repository_name="scale"))
    assert client.is_model_ready("scale") and client.is_server_live()
    # Triton's strict readiness counts every model a load reached: 'broken' failed, so not ready (a name with no
    # folder, or an override that does not parse, never reached one); an unload of 'broken' ends that
    assert not client.is_server_ready()
    client.unload_model("broken")
    assert client.is_server_ready()


def test_config_override_and_failed_reload_keeps_serving(explicit) -> None:
    _, client = explicit
    client.load_model("scale", config='{"max_batch_size":"16"}')
    assert client.get_model_config("scale").config.max_batch_size == 16
    assert infer(client, "scale", rows=16).shape == (16, 4)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("scale", config='{"input":[{"name":"NOPE","data_type":"TYPE_FP32","dims":[4]}]}')
    assert "load failed for model 'scale'" in err.value.message()
    assert client.is_model_ready("scale") and infer(client, "scale")[0, 0] == 2.0
    assert client.get_model_config("scale").config.max_batch_size == 16


def test_file_override_serves_a_new_onnx_model(explicit) -> None:
    server, client = explicit
    client.load_model("scale")
    client.load_model("scale", config="{}", files={"file:1/model.onnx": scale_model(5.0).SerializeToString()})
    assert infer(client, "scale")[0, 0] == 5.0
    client.load_model("brand_new", config="{}", files={"file:3/model.onnx": scale_model(7.0).SerializeToString()})
    assert list(client.get_model_metadata("brand_new").versions) == ["3"]
    assert infer(client, "brand_new")[0, 0] == 7.0
    with pytest.raises(InferenceServerException) as err:  # Triton's L0_lifecycle test_file_override
        client.load_model("scale", files={"file:1/model.onnx": b"x"})
    assert (err.value.status(), err.value.message()) == ("StatusCode.INTERNAL", POLL_FAILED.format("scale"))
    with httpclient.InferenceServerClient(server.http_url) as rest, pytest.raises(InferenceServerException) as err:
        rest.load_model("scale", files={"file:1/model.onnx": b"x"})
    assert (err.value.status(), err.value.message()) == ("500", POLL_FAILED.format("scale"))


TRAVERSAL_NAMES = ["../etc", "a/../b", "../../etc/passwd", "../../../../etc", "model/..", "..", "/etc/passwd",
                   "model/subdir", "model/", " ..", ".. ", "", "   ", "a\\b", "x" * 256]
HARMLESS_NAMES = ["...", "..my_model", "model..1", "model.version1"]
BAD_PATHS = ["../escaped", "/tmp/escaped_abs", "1/../../escaped", "1/./model.onnx", "", "1\\model.onnx",
             "1//model.onnx", "/".join(["d"] * 20) + "/f"]
POLL_FAILED = "failed to load '{}', failed to poll from model repository"


def test_traversal_names_and_paths_are_rejected_and_nothing_is_written(explicit, tmp_path: Path) -> None:
    server, client = explicit
    tmp = Path("/tmp")
    before = {p.name for p in tmp.iterdir() if p.name.startswith("kserve_v2_override_")}
    for name in TRAVERSAL_NAMES:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT", name
    for name in HARMLESS_NAMES:  # valid names: they fail as unknown models, not as unsafe ones
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert err.value.status() == "StatusCode.INTERNAL" and "failed to poll" in err.value.message(), name
    for path in BAD_PATHS:
        with pytest.raises(InferenceServerException) as err:
            client.load_model("scale", config="{}", files={"file:" + path: b"payload",
                                                           "file:1/model.onnx": scale_model(9.0).SerializeToString()})
        assert (err.value.status(), err.value.message()) == ("StatusCode.INVALID_ARGUMENT", POLL_FAILED.format("scale"))
    # files that cannot be written: a file where a folder must go, and simple_grpc_model_control.py's 256-byte name
    for files in ({"file:1": b"x", "file:1/model.onnx": b"y"}, {"file:1/" + "A" * 256: b"x"}):
        with pytest.raises(InferenceServerException) as err:
            client.load_model("scale", config="{}", files=files)
        assert (err.value.status(), err.value.message()) == ("StatusCode.INTERNAL", POLL_FAILED.format("scale"))
    log = server.log()  # the detail goes to the server log only, as Triton logs it
    assert "Poll failed for model directory 'scale': file: path has a component longer than 255 bytes" in log
    assert "cannot be written: " in log
    assert not (tmp / "escaped_abs").exists() and not (tmp / "escaped").exists()
    assert not any(p.name == "escaped" for p in tmp_path.rglob("escaped"))
    after = {p.name for p in tmp.iterdir() if p.name.startswith("kserve_v2_override_")}
    assert after == before, "override folders left behind"
    assert client.is_server_live() and client.is_server_ready()
    assert "Traceback" not in server.log()


def test_reload_under_traffic_from_another_process_drops_nothing(explicit) -> None:
    server, client = explicit
    client.load_model("scale")
    # the traffic prints each value the first time it sees it, and stops when its standard input closes
    script = f"""
import sys, threading, numpy as np, tritonclient.grpc as g
c = g.InferenceServerClient("{server.url}")
ok = failed = 0; seen = set(); stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    t = g.InferInput("INPUT0", [1, 4], "FP32"); t.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        value = float(c.infer("scale", [t]).as_numpy("OUTPUT0")[0, 0]); ok += 1
        if value not in seen:
            seen.add(value); print("seen", value, flush=True)
    except Exception as e:
        failed += 1; print("FAILED", e, flush=True)
print(ok, failed, sorted(seen))
"""
    traffic = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in traffic.stdout], daemon=True).start()

    def wait_seen(value: float) -> None:  # the traffic has been answered by that version
        while (line := lines.get(timeout=60)) != f"seen {value}\n":
            assert not line.startswith("FAILED"), line

    wait_seen(2.0)
    for factor in (10.0, 20.0, 30.0, 40.0):
        client.load_model("scale", config="{}", files={"file:1/model.onnx": scale_model(factor).SerializeToString()})
        wait_seen(factor)
    traffic.stdin.close()
    assert traffic.wait(timeout=60) == 0
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    ok, failed, seen = rest[-1].split(" ", 2)
    assert int(failed) == 0 and int(ok) >= 5, rest
    assert seen.strip() == "[2.0, 10.0, 20.0, 30.0, 40.0]", rest


def test_unload_waits_for_requests_in_flight(repository: Path, tmp_path: Path) -> None:
    add_model(repository, "slow", timed_matmul_model(1024, 512, 0.2),  # 0.2 s for the 512 rows below
              'max_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 1024] }]\n'
              'instance_group [{ kind: KIND_CPU count: 1 }]')
    server = start_server(repository, tmp_path / "logs", "--model-control-mode", "explicit", "--load-model", "slow")
    results: list = []
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            tensor = grpcclient.InferInput("INPUT0", [512, 1024], "FP32")
            tensor.set_data_from_numpy(np.ones((512, 1024), np.float32))
            for _ in range(3):
                client.async_infer("slow", [tensor], callback=lambda result, error: results.append(error))
            assert wait_admitted(server.metrics_port, "slow", 3) >= 2  # unload comes while they run
            client.unload_model("slow")  # returns once the three have finished and the session is closed
            assert len(results) == 3 and results == [None, None, None]
            assert not client.is_model_ready("slow")
    finally:
        assert server.stop() == 0


def test_poll_mode_follows_the_repository(repository: Path, tmp_path: Path) -> None:
    interval = 0.5
    server = start_server(repository, tmp_path / "logs", "--model-control-mode", "poll",
                          "--repository-poll-secs", str(interval), "--exit-on-error=false")  # broken fails
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            def within_two_intervals(condition) -> bool:
                # two scans and a load, with room for a loaded machine; still well under the 15 s default
                deadline = time.monotonic() + 2 * interval + 8.0
                while time.monotonic() < deadline:
                    if condition():
                        return True
                    time.sleep(0.05)
                return False

            with pytest.raises(InferenceServerException) as err:
                client.load_model("scale")
            assert (err.value.status(), err.value.message()) == (
                "StatusCode.UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")
            add_model(repository, "added", scale_model(4.0))
            assert within_two_intervals(lambda: client.is_model_ready("added"))
            add_model(repository, "scale", scale_model(6.0), versions=(2,))
            assert within_two_intervals(lambda: client.is_model_ready("scale", "2"))
            assert infer(client, "scale")[0, 0] == 6.0 and not client.is_model_ready("scale", "1")
            import shutil
            shutil.rmtree(repository / "added")
            assert within_two_intervals(lambda: "added" not in {m.name for m in client.get_model_repository_index().models})
            assert not client.is_model_ready("added")
    finally:
        assert server.stop() == 0


def test_poll_mode_new_and_broken_versions_as_triton(tmp_path: Path) -> None:
    """A version a new one replaced counts as unloaded (the server stays ready, strict readiness); a
    version that fails to load leaves what serves serving (Triton's all-or-nothing load) and, as in
    Triton's strict readiness, the server unready until it is fixed (found by the fleet drill)."""
    repository = tmp_path / "repo"
    add_model(repository, "scale", scale_model(2.0))
    server = start_server(repository, tmp_path / "logs", "--model-control-mode", "poll", "--repository-poll-secs", "0.5")

    def wait(condition, what: str) -> None:
        deadline = time.monotonic() + 15
        while not condition():
            assert time.monotonic() < deadline, f"{what}:\n{server.log()[-3000:]}"
            time.sleep(0.05)

    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            def rows() -> dict[str, tuple[str, str]]:
                return {m.version: (m.state, m.reason) for m in client.get_model_repository_index().models}

            assert client.is_server_ready()
            add_model(repository, "scale", scale_model(6.0), versions=(2,))
            wait(lambda: client.is_model_ready("scale", "2"), "version 2 loaded")
            assert infer(client, "scale")[0, 0] == 6.0 and not client.is_model_ready("scale", "1")
            assert rows()["1"] == ("UNAVAILABLE", "unloaded") and client.is_server_ready()
            add_model(repository, "scale", b"not onnx", versions=(3,))
            wait(lambda: "3" in rows(), "the broken version 3 tried")
            state, reason = rows()["3"]
            assert state == "UNAVAILABLE" and "INVALID_PROTOBUF" in reason
            assert client.is_model_ready("scale", "2") and infer(client, "scale")[0, 0] == 6.0
            assert not client.is_server_ready()  # Triton: a version UNAVAILABLE for another reason than an unload
            import shutil
            shutil.rmtree(repository / "scale" / "3")
            wait(client.is_server_ready, "ready again once the broken version is gone")
            assert infer(client, "scale")[0, 0] == 6.0 and "3" not in rows()
    finally:
        assert server.stop() == 0


def test_load_unload_storm_leaves_other_models_alone(explicit) -> None:
    server, client = explicit
    failures: list[str] = []
    served = [0]
    stop = threading.Event()

    def storm(worker: int) -> None:
        with grpcclient.InferenceServerClient(server.url) as own:
            for i in range(200):
                try:
                    own.load_model("scale") if (i + worker) % 2 == 0 else own.unload_model("scale")
                except InferenceServerException as err:
                    failures.append(f"storm: {err}")

    def traffic() -> None:
        with grpcclient.InferenceServerClient(server.url) as own:
            while not stop.is_set():
                try:
                    assert infer(own, "other")[0, 0] == 3.0
                    served[0] += 1
                except Exception as err:  # noqa: BLE001 - any failure on the other model is a test failure
                    failures.append(f"traffic: {err}")

    workers = [threading.Thread(target=storm, args=(w,)) for w in range(8)]
    reader = threading.Thread(target=traffic)
    reader.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    stop.set()
    reader.join(timeout=30)
    assert failures == [] and served[0] > 0
    client.load_model("scale")
    assert client.is_model_ready("scale") and infer(client, "scale")[0, 0] == 2.0
    client.unload_model("scale")
    assert not client.is_model_ready("scale") and client.is_server_live()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_memory_returns_after_load_unload_cycles(explicit) -> None:
    """50 cycles of load + unload, 10 of them failed loads: RSS stays within a fixed bound."""
    server, client = explicit
    big = matmul_model(1024)  # 4 MiB of weights, so a leak would show
    files = {"file:1/model.onnx": big.SerializeToString()}
    config = '{"input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[-1,1024]}]}'
    samples = []
    for cycle in range(50):
        if cycle % 5 == 4:
            with pytest.raises(InferenceServerException):
                client.load_model("big", config=config, files={"file:1/model.onnx": b"broken"})
        else:
            client.load_model("big", config=config, files=files)
            tensor = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 1024), np.float32))
            client.infer("big", [tensor])
        client.unload_model("big")
        samples.append(_rss_mib(server.proc.pid))
    growth = samples[-1] - samples[9]
    print(f"RSS after cycle 10: {samples[9]:.1f} MiB, after cycle 50: {samples[-1]:.1f} MiB, growth {growth:+.1f} MiB")
    assert growth < 40, samples


def _encode_status(server, name: str) -> int:
    return http_request(server, f"/v1/encode/{name}", body={"items": [{"text": "x"}]}).status_code


def test_an_alias_of_a_model_not_loaded_follows_its_config_file(explicit, repository: Path) -> None:
    """A ``/v1`` name that no folder has is looked up as the ``alias`` parameter of every stored
    configuration. Those are read once and again only when their file changes (before, every such
    request read and parsed every config.pbtxt of the repository on the event loop: 49 ms a request
    with 50 models not loaded)."""
    server, _ = explicit
    config = repository / "scale" / "config.pbtxt"
    config.write_text('parameters { key: "alias" value { string_value: "first" } }\n')
    assert _encode_status(server, "first") == 503  # the alias names 'scale', which is not loaded
    assert _encode_status(server, "second") == 404
    written = config.stat().st_mtime_ns
    config.write_text(config.read_text().replace('"first"', '"second"'))
    os.utime(config, ns=(written + 2 * 10**9, written + 2 * 10**9))  # a new modification time, even on coarse clocks
    assert _encode_status(server, "second") == 503
    assert _encode_status(server, "first") == 404
    config.unlink()
    assert _encode_status(server, "second") == 404
