"""HAProxy in front of the fleet drill's replicas (`make fleet-drill`), routing as a Kubernetes Service with
readiness probes routes: round robin over the replicas whose ``GET /v2/health/ready`` answers 200.

Two frontends on loopback: REST over HTTP/1.1 and gRPC over HTTP/2 cleartext (h2c, ``proto h2`` on the bind
and on the servers). Each replica is health-checked on its HTTP port every ``INTER`` (one failure takes it out,
two successes put it back). An admin socket (``HAProxy.set_state``) takes a replica out of both backends and puts it
back, as the endpoints controller removes a terminating pod from a Service's endpoints during its preStop.

A request that could not reach a live replica is sent to another one (``retries 2``, ``option redispatch 1``,
``retry-on conn-failure empty-response``), as the proxies in front of a KServe InferenceService do by default
(Istio's retry policy: ``connect-failure``; nginx's ``proxy_next_upstream error``, which covers an error "while
establishing a connection with the server, passing a request to it, or reading the response header"): its
connection was refused (the replica is gone), or the kept-alive connection it went out on was closed with no answer
(the replica died, and HAProxy had not yet seen that connection close). An inference request has no side effect
to repeat, but a request in flight on a replica that dies is retried too: the drill counts those as allowed to fail.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

INTER = "500ms"  # health-check interval per replica


@dataclass(frozen=True)
class Backend:
    """A replica's loopback ports."""

    http: int
    grpc: int


def haproxy_config(rest_port: int, grpc_port: int, replicas: list[Backend], socket_path: Path) -> str:
    """HAProxy's configuration (haproxy.cfg text) for REST on ``rest_port`` and gRPC on ``grpc_port``, its admin
    socket at ``socket_path``; the servers are named r0, r1, ... in the order of ``replicas``."""
    check = f"check port {{http}} inter {INTER} fall 1 rise 2"
    rest = "\n".join(f"    server r{i} 127.0.0.1:{r.http} {check.format(http=r.http)}" for i, r in enumerate(replicas))
    grpc = "\n".join(f"    server r{i} 127.0.0.1:{r.grpc} proto h2 check-proto h1 {check.format(http=r.http)}"
                     for i, r in enumerate(replicas))
    return f"""global
    maxconn 1000
    stats socket {socket_path} mode 600 level admin

defaults
    mode http
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 60s

frontend rest
    bind 127.0.0.1:{rest_port}
    default_backend replicas_rest

frontend grpc
    bind 127.0.0.1:{grpc_port} proto h2
    default_backend replicas_grpc

backend replicas_rest
    balance roundrobin
    option httpchk GET /v2/health/ready
{rest}

backend replicas_grpc
    balance roundrobin
    option httpchk GET /v2/health/ready
{grpc}
"""


class HAProxy:
    """``haproxy -db`` for ``replicas`` (the configuration written to ``folder``) until ``stop()``; its output (the
    servers' state changes among it) in ``folder/haproxy.log``."""

    def __init__(self, folder: Path, rest_port: int, grpc_port: int, replicas: list[Backend]) -> None:
        self.config = folder / "haproxy.cfg"
        self.socket_path = folder / "haproxy.sock"
        self.config.write_text(haproxy_config(rest_port, grpc_port, replicas, self.socket_path))
        self.log_path = folder / "haproxy.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config)], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        time.sleep(0.5)  # binding takes milliseconds; an invalid configuration exits at once
        if self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"haproxy exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")

    def command(self, line: str) -> str:
        """One command on the admin socket (HAProxy's management guide, "Unix Socket commands"); its answer."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(f"{line}\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode().strip()

    def set_state(self, server: int, state: str) -> None:
        """``set server <backend>/r<server> state <state>`` ("maint" takes it out, "ready" puts it back under its
        health checks) on both backends; raises RuntimeError when HAProxy refuses."""
        for backend in ("replicas_rest", "replicas_grpc"):
            answer = self.command(f"set server {backend}/r{server} state {state}")
            if answer:
                raise RuntimeError(f"haproxy: set server {backend}/r{server} state {state}: {answer}")

    def states(self) -> dict[str, str]:
        """Each server's status now ("UP", "DOWN", "MAINT", ...), by "<backend>/<server>" (``show stat``)."""
        rows = [line.split(",") for line in self.command("show stat").splitlines()[1:] if line]
        return {f"{row[0]}/{row[1]}": row[17] for row in rows if row[1] not in ("FRONTEND", "BACKEND")}

    def events(self) -> list[str]:
        """The servers' state changes HAProxy logged ("Server replicas_rest/r1 is DOWN, reason: ...")."""
        return [line for line in self.log_path.read_text().splitlines() if "Server replicas_" in line]

    def stop(self) -> None:
        """Stop HAProxy (SIGTERM, then SIGKILL after 10 s) and close its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()

    def __enter__(self) -> HAProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
