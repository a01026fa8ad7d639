"""Triton's lifecycle surface (qa/L0_lifecycle): --exit-on-error, a repository path given twice and
the load-error text, through a real server and unmodified tritonclient."""

from __future__ import annotations

import re
import subprocess
import sys

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from helpers import ROOT, add_model, identity_model, start_server, wait_until
from kserve_v2 import __version__


def _wait_for(server, text: str, timeout: float = 60) -> None:
    """Wait for a log line, then read the HTTP port (logged after the gRPC one)."""
    def logged() -> bool:
        assert server.proc.poll() is None, server.log()
        return text in server.log() and "HTTP server listening" in server.log()

    wait_until(logged, f"the log line {text!r}", timeout)
    server.http_port = int(re.search(r"HTTP server listening on [^:]+:(\d+)", server.log()).group(1))


@pytest.mark.parametrize("strict, with_good_repository", [("true", False), ("false", False), ("true", True)])
def test_unreadable_repository_with_exit_on_error_false_serves_health_and_metadata(
        tmp_path, strict: str, with_good_repository: bool) -> None:
    """test_parse_error_noexit: not live and not ready whatever --strict-readiness says; metadata answers."""
    good = tmp_path / "models"
    add_model(good, "ident", identity_model(TensorProto.FLOAT))
    extra = ("--model-repository", str(good)) if with_good_repository else ()
    server = start_server(tmp_path / "xyzx", tmp_path, "--exit-on-error=false", f"--strict-readiness={strict}",
                          "--server-name", "triton", *extra, wait_startup=False)
    try:
        _wait_for(server, "server failed to initialize: model repository")
        with grpcclient.InferenceServerClient(server.url) as client:
            assert not client.is_server_live() and not client.is_server_ready()
            metadata = client.get_server_metadata()
            assert (metadata.name, metadata.version) == ("triton", __version__)
            assert not client.get_model_repository_index().models  # nothing was read
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert not client.is_server_live() and not client.is_server_ready()
            assert client.get_server_metadata()["name"] == "triton"
        with grpc.insecure_channel(server.url) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("live", ""):
                status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("args, text", [
    (("--model-repository", "{tmp}/xyzx"), "model repository '{tmp}/xyzx' is not a directory"),  # the default: exit
    (("--model-repository", "{tmp}", "--model-namespacing=true"), "--model-namespacing=true is not supported"),
])
def test_usage_errors(tmp_path, args, text) -> None:
    args = tuple(arg.format(tmp=tmp_path) for arg in args)
    done = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and text.format(tmp=tmp_path) in done.stderr


@pytest.mark.parametrize("mode", [("--model-control-mode", "none"), ("--model-control-mode", "explicit",
                                                                       "--load-model", "broken")])
def test_a_startup_model_that_fails_exits_unless_exit_on_error_is_false(tmp_path, mode: tuple[str, ...]) -> None:
    """Triton's "error: creating server: Internal - failed to load all models" and exit 1 by default;
    with --exit-on-error=false the server stays up, the good model READY and the server not ready."""
    repository = tmp_path / "models"
    add_model(repository, "good", identity_model(TensorProto.FLOAT))
    add_model(repository, "broken", b"not an onnx model")
    command = [sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(repository), "--grpc-port", "0",
               "--http-port", "0", "--metrics-port", "0", *mode]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "failed to load all models" in done.stderr and "failed to load model 'broken'" in done.stderr
    server = start_server(repository, tmp_path, "--exit-on-error=false", *mode)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_live() and not client.is_server_ready()
            assert not client.is_model_ready("broken")
            assert client.is_model_ready("good") == (mode[1] == "none")
    finally:
        assert server.stop() == 0


def test_a_repository_given_twice_is_one_repository(tmp_path) -> None:
    """test_config_override starts Triton with the same --model-repository twice: one repository."""
    repository = tmp_path / "models"
    add_model(repository, "ident", identity_model(TensorProto.FLOAT), versions=(1, 2))
    server = start_server(repository, tmp_path, "--model-repository", str(repository), "--model-repository",
                          f"{repository}/", "--model-control-mode", "explicit")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert [m.name for m in client.get_model_repository_index().models] == ["ident"]
            client.load_model("ident", config='{"version_policy": {"specific": {"versions": [2]}}}')
            assert client.is_model_ready("ident", "2") and not client.is_model_ready("ident", "1")
            assert [(m.name, m.version, m.state) for m in client.get_model_repository_index().models] == [
                ("ident", "2", "READY")]
    finally:
        assert server.stop() == 0


def test_load_error_text_is_tritons(tmp_path) -> None:
    """test_model_control_fail: "load failed for model '<m>': version <v> is at UNAVAILABLE state:
    <reason>;" per version, the reason being the repository index's, over gRPC and HTTP."""
    repository = tmp_path / "models"
    add_model(repository, "broken", b"not an onnx model", versions=(1, 3),
              config='name: "broken"\nversion_policy { all {} }\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
                     'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]\n')
    server = start_server(repository, tmp_path, "--model-control-mode", "explicit")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            for _ in range(2):  # another attempt fails the same way
                with pytest.raises(InferenceServerException) as err:
                    client.load_model("broken")
                assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
                reasons = {m.version: m.reason for m in client.get_model_repository_index().models}
                assert set(reasons) == {"1", "3"} and all("Protobuf parsing failed" in r for r in reasons.values())
                assert err.value.message() == ("load failed for model 'broken': "
                                               f"version 1 is at UNAVAILABLE state: {reasons['1']};"
                                               f"version 3 is at UNAVAILABLE state: {reasons['3']};\n")
            grpc_message = err.value.message()
        with httpclient.InferenceServerClient(server.http_url) as client:
            with pytest.raises(InferenceServerException) as err:
                client.load_model("broken")
            assert err.value.status() == "400" and err.value.message() == grpc_message
            with pytest.raises(InferenceServerException) as err:
                client.load_model("no_such_model")  # Triton's text for a name in no repository
            assert err.value.message() == "failed to load 'no_such_model', failed to poll from model repository"
    finally:
        assert server.stop() == 0
