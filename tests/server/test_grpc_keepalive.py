"""The gRPC port's HTTP/2 keepalive and ping policy flags, seen on the wire by a raw HTTP/2 client (h2).

Server pings follow ``--grpc-keepalive-time`` on idle connections when
``--grpc-keepalive-permit-without-calls`` is on; a burst of client pings is struck out under the
defaults (Triton's: 2 strikes) and tolerated under ``--grpc-http2-max-ping-strikes``: the
connection then still serves a call. The frames follow RFC 9113; the calls are gRPC's HTTP/2
mapping (PROTOCOL-HTTP2.md in grpc/grpc).

Not shown here because gRPC (grpcio 1.81) showed no effect of them on the wire: an unacknowledged
server ping did not close the connection within 50 s under ``--grpc-keepalive-timeout 500``;
server pings went on past ``--grpc-http2-max-pings-without-data 1``; and client pings beside a call
were still struck out under ``--grpc-http2-min-recv-ping-interval-without-data 0``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
from tritonclient.grpc import service_pb2

from helpers import EXAMPLES, Server, start_server

LIVE = "/inference.GRPCInferenceService/ServerLive"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
ENHANCE_YOUR_CALM = 0xB


class Http2:
    """An HTTP/2 client connection to the gRPC port that reports every frame's events (h2 acknowledges
    PING and SETTINGS frames itself)."""

    def __init__(self, server: Server) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size and (chunk := self.sock.recv(size - len(data))):
            data += chunk
        return data

    def events(self) -> Iterator[h2.events.Event]:
        """Every frame's events until the server closes the connection (a 30 s silence fails the test).

        Frames go to h2 one at a time (split on the 24-bit length that opens every frame header) so a
        GOAWAY's event is reported even when frames for open streams follow it, which h2 refuses."""
        while len(header := self._read(9)) == 9:
            events = self.conn.receive_data(header + self._read(int.from_bytes(header[:3], "big")))
            if pending := self.conn.data_to_send():
                self.sock.sendall(pending)
            yield from events

    def ping_burst(self, count: int) -> None:
        for i in range(count):
            self.conn.ping(b"%08d" % i)
        self.sock.sendall(self.conn.data_to_send())

    def _call(self, path: str) -> int:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                                        ("content-type", "application/grpc"), ("te", "trailers")])
        return stream

    def open_stream(self) -> None:
        """A ModelStreamInfer call left open once the server has answered one request on it: a call in flight."""
        stream = self._call(STREAM)
        request = service_pb2.ModelInferRequest(model_name="simple", raw_input_contents=[bytes(64)] * 2)
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message = request.SerializeToString()
        self.conn.send_data(stream, b"\x00" + len(message).to_bytes(4, "big") + message)  # gRPC's length prefix
        self.sock.sendall(self.conn.data_to_send())
        assert any(isinstance(e, h2.events.DataReceived) and e.stream_id == stream
                   for e in _until(self.events(), h2.events.DataReceived))

    def server_live(self) -> tuple[bytes, bytes] | str:
        """One unary ServerLive call: (response message with gRPC's 5-byte prefix, grpc-status), or the
        debug data of the GOAWAY (ENHANCE_YOUR_CALM) that closed the connection first."""
        stream = self._call(LIVE)
        self.conn.send_data(stream, b"\x00\x00\x00\x00\x00", end_stream=True)  # an empty ServerLiveRequest
        try:
            self.sock.sendall(self.conn.data_to_send())
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed after a GOAWAY, which is still there to read
        body = b""
        for event in self.events():
            if isinstance(event, h2.events.ConnectionTerminated):
                assert event.error_code == ENHANCE_YOUR_CALM, event
                return event.additional_data.decode()
            if isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                body += event.data
            if isinstance(event, h2.events.TrailersReceived) and event.stream_id == stream:
                return body, dict(event.headers)[b"grpc-status"]
        raise AssertionError("the connection closed before the call was answered")

    def outcome(self, pings: int) -> str:
        """After a burst of ``pings`` (all acknowledged): "served" if a ServerLive call is answered
        next, else the debug data of the GOAWAY that closed the connection ("too_many_pings")."""
        _until(self.events(), h2.events.PingAckReceived, pings)
        answer = self.server_live()  # frames are handled in order: a GOAWAY for the pings comes first
        if isinstance(answer, str):
            return answer
        assert answer == LIVE_TRUE
        return "served"

    def close(self) -> None:
        self.sock.close()


def test_server_pings_an_idle_connection_at_the_keepalive_time(tmp_path) -> None:
    """The default keepalive time is two hours: a server ping on an idle connection is the flags at work."""
    server = start_server(EXAMPLES, tmp_path, "--grpc-keepalive-time", "200",
                          "--grpc-keepalive-permit-without-calls", "true")
    client = Http2(server)
    try:
        _until(client.events(), h2.events.PingReceived, 2)
        assert client.server_live() == LIVE_TRUE
    finally:
        client.close()
        assert server.stop() == 0


def test_ping_strikes_close_the_connection_unless_the_flags_allow_the_pings(example_server: Server, tmp_path) -> None:
    """Five pings at once, on an idle connection and beside an open call: strikes under the defaults
    (the shared example server: GOAWAY ENHANCE_YOUR_CALM "too_many_pings" after the third, for that
    connection only), tolerated under a higher --grpc-http2-max-ping-strikes or 0 (any number)."""
    started = {"strikes": start_server(EXAMPLES, tmp_path / "strikes", "--grpc-http2-max-ping-strikes", "10"),
               "any": start_server(EXAMPLES, tmp_path / "any", "--grpc-http2-max-ping-strikes", "0")}
    servers = {"default": example_server, **started}
    try:
        outcomes = {}
        for name, server in servers.items():
            for busy in (False, True):  # busy: a ModelStreamInfer call is open, so the connection is not idle
                client = Http2(server)
                if busy:
                    client.open_stream()
                client.ping_burst(5)
                outcomes[name, busy] = client.outcome(5)
                client.close()
        assert outcomes == {
            ("default", False): "too_many_pings", ("default", True): "too_many_pings",
            ("strikes", False): "served", ("strikes", True): "served",
            ("any", False): "served", ("any", True): "served"}, outcomes
    finally:
        for server in started.values():
            assert server.stop() == 0


LIVE_TRUE = (b"\x00\x00\x00\x00\x02\x08\x01", b"0")  # ServerLiveResponse {live: true}, grpc-status 0


def _until(events: Iterator[h2.events.Event], kind: type, count: int = 1) -> list[h2.events.Event]:
    """The events up to and including the ``count``-th of ``kind``."""
    seen: list[h2.events.Event] = []
    for event in events:
        seen.append(event)
        if sum(isinstance(e, kind) for e in seen) == count:
            return seen
        assert not isinstance(event, h2.events.ConnectionTerminated), seen
    raise AssertionError(f"the connection closed after {seen}")
