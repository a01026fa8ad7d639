"""`make fleet-drill` (tests/deploy/fleet_drill.py) without containers: the HAProxy configuration it generates is
valid for the haproxy on this host (``haproxy -c``), routes REST over HTTP/1.1 and gRPC over h2c with readiness
checks on each replica's HTTP port, retrying only a request no live replica got, and the replicas get the KServe runtime's args in poll mode. The
drills themselves are `make fleet-drill`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import fleet_balancer
import fleet_replicas
from deploy_support import DEPLOY


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy here (deploy/docker/fleet_host.sh installs it)")
def test_generated_haproxy_config_is_valid(tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    backends = [fleet_balancer.Backend(18080 + i, 18180 + i) for i in range(3)]
    config.write_text(fleet_balancer.haproxy_config(18000, 18001, backends, tmp_path / "haproxy.sock"))
    checked = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_balancer_routes_as_a_service_with_readiness_probes(tmp_path: Path) -> None:
    backends = [fleet_balancer.Backend(18080 + i, 18180 + i) for i in range(3)]
    text = fleet_balancer.haproxy_config(18000, 18001, backends, tmp_path / "haproxy.sock")
    assert "bind 127.0.0.1:18001 proto h2" in text and text.count("option httpchk GET /v2/health/ready") == 2
    assert "server r2 127.0.0.1:18182 proto h2 check-proto h1 check port 18082" in text
    assert "retries 2" in text and "option redispatch 1" in text and "retry-on conn-failure empty-response" in text


def test_replicas_poll_the_bucket_with_the_runtime_args() -> None:
    args = fleet_replicas.replica_args("s3://127.0.0.1:9000/models/fleet", 2)
    assert args[0] == "serve" and "--log-format=json" in args and "--exit-timeout-secs=15" in args
    assert args[-4:] == ["--model-repository=s3://127.0.0.1:9000/models/fleet", "--model-control-mode=poll",
                         "--repository-poll-secs=2", "--strict-readiness=false"]
    assert [a for a in args if a.startswith("--strict-readiness")] == ["--strict-readiness=false"]
    assert not any(a.startswith(("--http-port", "--grpc-port", "--metrics-port", "--model-repository=/")) for a in args)


def test_fleet_host_script_is_executable() -> None:
    assert os.access(DEPLOY / "docker" / "fleet_host.sh", os.X_OK)
