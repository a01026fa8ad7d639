"""TLS, mutual TLS, Triton's restricted API groups and the bearer token, against a real server.

Certificates are made here (trustme): one CA for the server and the good client, another CA for
the client that must be turned away.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
import trustme
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers import EXAMPLES, ROOT, Server, start_server


class Pki:
    """PEM files: the CA, the server's certificate and key, a good and a bad client pair."""

    def __init__(self, folder: Path) -> None:
        ca, stranger = trustme.CA(), trustme.CA()
        self.ca = folder / "ca.pem"
        ca.cert_pem.write_to_path(self.ca)
        self.server_cert, self.server_key = self._pair(ca.issue_cert("127.0.0.1", "localhost"), folder, "server")
        self.client_cert, self.client_key = self._pair(ca.issue_cert("client.example"), folder, "client")
        self.bad_cert, self.bad_key = self._pair(stranger.issue_cert("client.example"), folder, "bad")

    @staticmethod
    def _pair(cert: trustme.LeafCert, folder: Path, name: str) -> tuple[Path, Path]:
        chain, key = folder / f"{name}.pem", folder / f"{name}.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(key)
        return chain, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def _tls_args(pki: Pki, mutual: bool) -> list[str]:
    args = []
    for proto in ("grpc", "http"):
        args += [f"--{proto}-use-ssl{'-mutual' if mutual else ''}", "true", f"--{proto}-server-cert", str(pki.server_cert),
                 f"--{proto}-server-key", str(pki.server_key), f"--{proto}-root-cert", str(pki.ca)]
    return args


def _grpc_live(server: Server, **ssl: object) -> bool:
    with grpcclient.InferenceServerClient(server.url, **ssl) as client:  # type: ignore[arg-type]
        return client.is_server_live(client_timeout=10)


def test_tls_serves_trusting_clients_and_refuses_plaintext(pki: Pki, tmp_path: Path) -> None:
    server = start_server(EXAMPLES, tmp_path, *_tls_args(pki, mutual=False))
    try:
        assert _grpc_live(server, ssl=True, root_certificates=str(pki.ca))
        with grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(pki.ca)) as client:
            inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
            result = client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.arange(16).reshape(1, 16))
        with pytest.raises(InferenceServerException) as plain:
            _grpc_live(server)
        assert plain.value.status() == "StatusCode.UNAVAILABLE"
        assert requests.get(f"https://{server.http_url}/v2/health/live", verify=str(pki.ca), timeout=30).status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://{server.http_url}/v2/health/live", timeout=30)
    finally:
        assert server.stop() == 0


def test_mutual_tls_needs_a_client_certificate_from_the_root(pki: Pki, tmp_path: Path) -> None:
    server = start_server(EXAMPLES, tmp_path, *_tls_args(pki, mutual=True))
    good = {"ssl": True, "root_certificates": str(pki.ca), "private_key": str(pki.client_key),
            "certificate_chain": str(pki.client_cert)}
    try:
        assert _grpc_live(server, **good)
        for bad in ({"private_key": str(pki.bad_key), "certificate_chain": str(pki.bad_cert)},
                    {"private_key": None, "certificate_chain": None}):
            with pytest.raises(InferenceServerException) as refused:
                _grpc_live(server, **{**good, **bad})
            assert refused.value.status() == "StatusCode.UNAVAILABLE"
        url = f"https://{server.http_url}/v2/health/live"
        assert requests.get(url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)),
                            timeout=30).status_code == 200
        for cert in ((str(pki.bad_cert), str(pki.bad_key)), None):
            with pytest.raises(requests.exceptions.ConnectionError):  # the TLS handshake fails (SSLError)
                requests.get(url, verify=str(pki.ca), cert=cert, timeout=30)
    finally:
        assert server.stop() == 0


# ---- restricted API groups and the bearer token ------------------------------------------------

RESTRICTED = ("model-repository,shared-memory:admin-key=s3cret", "inference:infer-key=let-me-in")


@pytest.fixture(scope="module")
def restricted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [arg for spec in RESTRICTED for arg in ("--grpc-restricted-protocol", spec, "--http-restricted-api", spec)]
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"), *args, "--api-key", "sk-test-token")
    yield server
    assert server.stop() == 0


def _simple_inputs() -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def test_grpc_restricted_groups_need_their_metadata(restricted_server: Server) -> None:
    admin = {"triton-grpc-protocol-admin-key": "s3cret"}
    with grpcclient.InferenceServerClient(restricted_server.url) as client:
        assert client.is_server_live() and client.is_server_ready()  # health is not restricted
        assert client.get_server_metadata().name
        for headers in (None, {"triton-grpc-protocol-admin-key": "wrong"}, {"admin-key": "s3cret"}):
            with pytest.raises(InferenceServerException) as denied:
                client.get_model_repository_index(headers=headers)
            assert denied.value.status() == "StatusCode.UNAVAILABLE"
            assert "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'" in str(denied.value)
        assert client.get_model_repository_index(headers=admin).models
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
            client.get_system_shared_memory_status()
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
            client.infer("simple", _simple_inputs())
        result = client.infer("simple", _simple_inputs(), headers={"triton-grpc-protocol-infer-key": "let-me-in"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))
    with grpc.insecure_channel(restricted_server.url) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_http_restricted_groups_need_their_header(restricted_server: Server) -> None:
    base = f"http://{restricted_server.http_url}"
    assert requests.get(f"{base}/v2/health/ready", timeout=30).status_code == 200
    assert requests.get(f"{base}/v2/models/simple", timeout=30).status_code == 200
    for headers in ({}, {"admin-key": "wrong"}):
        denied = requests.post(f"{base}/v2/repository/index", json={}, headers=headers, timeout=30)
        assert denied.status_code == 403
        assert denied.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
    assert requests.post(f"{base}/v2/repository/index", json={}, headers={"Admin-Key": "s3cret"}, timeout=30).ok
    assert requests.get(f"{base}/v2/systemsharedmemory/status", timeout=30).status_code == 403
    body = {"inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for i in range(2)]}
    assert requests.post(f"{base}/v2/models/simple/infer", json=body, timeout=30).status_code == 403
    allowed = requests.post(f"{base}/v2/models/simple/infer", json=body, headers={"infer-key": "let-me-in"}, timeout=30)
    assert allowed.status_code == 200 and allowed.json()["outputs"][0]["data"] == [2] * 16


def test_bearer_token_guards_the_semantic_and_openai_routes(restricted_server: Server) -> None:
    base = f"http://{restricted_server.http_url}/v1"
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
    assert refused.value.status_code == 401 and refused.value.response.headers["www-authenticate"] == "Bearer"
    client = openai.OpenAI(base_url=base, api_key="sk-test-token", max_retries=0,
                           default_headers={"infer-key": "let-me-in"})  # /v1/embeddings is in the inference group
    assert client.models.with_raw_response.list().http_response.status_code == 200
    # the token is accepted; the request then fails on its own terms (simple is no embedding model)
    with pytest.raises(openai.APIStatusError) as rejected:
        client.embeddings.create(model="simple", input="hello")
    assert rejected.value.status_code not in (401, 403)
    assert requests.post(f"{base}/encode/simple", json={}, headers={"infer-key": "let-me-in"}, timeout=30).status_code == 401
    assert requests.get(f"http://{restricted_server.http_url}/v2/health/live", timeout=30).status_code == 200


@pytest.mark.parametrize(("args", "message"), [
    # Triton's texts (L0_http / L0_grpc test.sh look for them in the output of a server that fails to start)
    (["--http-restricted-api", "model-reposit,health:k1=v1", "--http-restricted-api", "metadata,health:k2=v2"],
     "error: unknown restricted api 'model-reposit'\n"),
    (["--grpc-restricted-protocol", "model-reposit,health:k1=v1"], "error: unknown restricted protocol 'model-reposit'\n"),
    (["--http-restricted-api", "model-repository,health:k1=v1", "--http-restricted-api", "metadata,health:k2=v2"],
     "error: restricted api 'health' can not be specified in multiple config groups\n"),
    (["--grpc-restricted-protocol", "model-repository,health:k1=v1", "--grpc-restricted-protocol",
      "metadata,health:k2=v2"], "error: restricted protocol 'health' can not be specified in multiple config groups\n"),
    (["--grpc-restricted-protocol", "inference"],
     "error: --grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got inference\n"),
    (["--http-restricted-api", "inference:k="],
     "error: --http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference:k=\n"),
    (["--grpc-use-ssl", "true"], "--grpc-server-cert must name a PEM file"),
    (["--http-use-ssl-mutual", "true", "--http-server-cert", "README.md", "--http-server-key", "README.md"],
     "--http-root-cert must name a PEM file"),
    (["--http-header-timeout-secs", "0"], "--http-header-timeout-secs must be > 0"),
])
def test_bad_network_flags_refuse_to_start(args: list[str], message: str) -> None:
    run = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(EXAMPLES), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and message in run.stderr, run.stderr
