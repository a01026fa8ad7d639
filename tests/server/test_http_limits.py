"""HTTP connection hygiene against a real server: slowloris, short bodies, idle keep-alive, caps."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from helpers import EXAMPLES, Server, start_server, wait_until

SIMPLE_BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"), "--http-header-timeout-secs", "2",
                          "--http-body-timeout-secs", "2", "--http-keepalive-timeout-secs", "2",
                          "--http-max-header-size", "8192")
    yield server
    assert server.stop() == 0


def _connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=30)


def _read_to_close(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    started, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - started


def _simple_ok(server: Server) -> None:
    response = requests.post(f"http://{server.http_url}/v2/models/simple/infer", data=SIMPLE_BODY, timeout=30)
    assert response.status_code == 200, response.text


def test_slowloris_connections_get_408_and_are_closed(strict_server: Server) -> None:
    sockets = [_connect(strict_server) for _ in range(200)]
    for sock in sockets:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    _simple_ok(strict_server)  # others are served meanwhile
    for sock in sockets[:20]:
        sock.sendall(b"X-Drip: 1\r\n")  # dripping does not extend the deadline
    answers = [_read_to_close(sock, 30) for sock in sockets]
    assert all(data.startswith(b"HTTP/1.1 408 ") for data, _ in answers), answers[0]
    assert max(seconds for _, seconds in answers) < 20  # the deadline is 2 s; generous for a loaded machine
    for sock in sockets:
        sock.close()
    _simple_ok(strict_server)


def test_connection_that_sends_nothing_is_closed(strict_server: Server) -> None:
    with _connect(strict_server) as sock:
        data, seconds = _read_to_close(sock, 30)
    assert data.startswith(b"HTTP/1.1 408 ") and seconds < 20


def test_short_body_gets_408_within_the_body_timeout(strict_server: Server) -> None:
    with _connect(strict_server) as sock:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n" + SIMPLE_BODY)  # promises far more than it sends
        data, seconds = _read_to_close(sock, 30)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert b"stalled" in data and seconds < 20
    _simple_ok(strict_server)
    assert "Traceback" not in strict_server.log()


def test_idle_keep_alive_connection_is_closed(strict_server: Server) -> None:
    with _connect(strict_server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        data, seconds = _read_to_close(sock, 30)
    assert data.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in data.lower()  # a kept-alive answer
    assert seconds < 20  # then closed after the 2 s idle timeout


def test_oversized_headers_get_431(strict_server: Server) -> None:
    with _connect(strict_server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        data, _ = _read_to_close(sock, 30)
    assert data.startswith(b"HTTP/1.1 431 "), data


def _chunked(body: bytes, chunks: int) -> bytes:
    """``body`` as exactly ``chunks`` chunks (the last ones take the remainder)."""
    size = len(body) // chunks
    parts = [body[i * size:(i + 1) * size] for i in range(chunks - 1)] + [body[(chunks - 1) * size:]]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.mark.parametrize(("chunks", "status"), [(65_536, b"200"), (65_537, b"400")])
def test_chunk_cap_is_tritons(strict_server: Server, chunks: int, status: bytes) -> None:
    body = SIMPLE_BODY + b" " * (65_537 - len(SIMPLE_BODY))  # JSON allows trailing white space
    request = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + _chunked(body, chunks))
    with _connect(strict_server) as sock:
        sock.sendall(request)
        data, _ = _read_to_close(sock, 60)
    assert data.startswith(b"HTTP/1.1 " + status), data[:300]
    if status == b"400":
        assert b"65536 chunks" in data


def test_connection_cap_answers_503(tmp_path) -> None:
    server = start_server(EXAMPLES, tmp_path, "--http-max-connections", "8")
    try:
        def live() -> int:
            return requests.get(f"http://{server.http_url}/v2/health/live", timeout=30).status_code

        held = [_connect(server) for _ in range(8)]
        wait_until(lambda: live() == 503, "a ninth connection to be refused once the server holds the eight")
        for sock in held:
            sock.close()
        wait_until(lambda: live() == 200, "connections to be served again once the eight are closed")
    finally:
        assert server.stop() == 0
