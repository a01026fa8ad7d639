"""Connection hygiene for the HTTP listener: deadlines and caps uvicorn does not have.

uvicorn already closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 over a
connection cap (``limit_concurrency``). This protocol, a subclass of uvicorn's httptools one, adds
what a slow or hostile client needs to be stopped (``hardening-notes.md`` attacks 24 and the
CVE-2025-23310 chunk flood):

- header deadline: a request's line and headers must all arrive within ``header_timeout_s`` of its
  first byte (or of the connection opening); otherwise 408 and close (slowloris);
- body idle timeout: once the headers are in, the body may not stall for longer than
  ``body_timeout_s`` between reads (nginx's ``client_body_timeout``); otherwise 408 and close
  (a ``Content-Length`` that promises more than is sent);
- header size: more than ``max_header_bytes`` of request line and headers gives 431 and close;
- chunk count: more than ``max_chunks`` chunks in one chunked body gives 400 and close (Triton's
  ``kMaxChunkedChunks`` of 65,536).

Nothing here runs per request unless the request breaks a rule, except two timer operations and
one counter per request and one per chunk.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection rules (seconds, bytes, counts); see the module docstring."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_chunks: int = 65_536


class _Rejected(Exception):
    """Raised inside a parser callback to stop parsing; the status is sent by ``send_400_response``."""


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol enforcing ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HttpToolsProtocol with a header deadline, a body idle timeout, header and chunk caps."""

    limits: ConnectionLimits = ConnectionLimits()
    _deadline: asyncio.TimerHandle | None = None
    _body_at = 0.0
    _header_bytes = 0
    _chunks = 0
    _reject: tuple[int, str] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._header_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._chunks = 0
        if self._deadline is None:  # a keep-alive connection's next request
            self._arm(self.limits.header_timeout_s, self._header_timed_out)

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._body_at = self.loop.time()
        super().on_headers_complete()
        if self.parser.should_upgrade():
            return  # a WebSocket: the connection now belongs to uvicorn's WebSocket protocol
        self._arm(self.limits.body_timeout_s, self._body_timed_out)

    def on_body(self, body: bytes) -> None:
        self._body_at = self.loop.time()
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > self.limits.max_chunks + 1:  # the last, empty chunk ends the body
            self._stop(400, f"request body has more than {self.limits.max_chunks} chunks")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; a rule broken in a callback answers with its own status."""
        status, text = self._reject or (400, msg)
        self._reject = None
        self._respond(status, text)

    # ---- helpers ---------------------------------------------------------------------------

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes:
            self._stop(431, f"request line and headers are over {self.limits.max_header_bytes} bytes")

    def _stop(self, status: int, text: str) -> None:
        self._reject = (status, text)
        raise _Rejected(text)  # httptools stops parsing; uvicorn then calls send_400_response

    def _arm(self, delay: float, callback: object) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, callback)  # type: ignore[arg-type]

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_timed_out(self) -> None:
        self._deadline = None
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request: answer later
            self._arm(self.limits.header_timeout_s, self._header_timed_out)
            return
        self._respond(408, f"request headers not received within {self.limits.header_timeout_s:g} s")

    def _body_timed_out(self) -> None:
        self._deadline = None
        idle = self.loop.time() - self._body_at
        if idle < self.limits.body_timeout_s or self.flow.read_paused:  # data came, or the app is not reading
            self._arm(max(self.limits.body_timeout_s - idle, 0.05), self._body_timed_out)
            return
        self._respond(408, f"request body stalled for {self.limits.body_timeout_s:g} s")

    def _respond(self, status: int, text: str) -> None:
        """Answer ``status`` with a JSON error body (unless a response has started) and close."""
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = b'{"error":"' + text.replace('"', "'").encode("ascii", "replace") + b'"}'
            head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            self.transport.write(head % (status, _REASONS.get(status, b"Error"), len(body)) + body)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application sees http.disconnect from now on
            self.cycle.message_event.set()
        self.transport.close()
