"""Connection hygiene for the HTTP listener: deadlines and caps uvicorn does not have.

uvicorn already closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 over a
connection cap (``limit_concurrency``). This protocol, a subclass of uvicorn's httptools one, adds
what a slow or hostile client needs to be stopped (slowloris and the
CVE-2025-23310 chunk flood):

- header deadline: a request's line and headers must all arrive within ``header_timeout_s`` of its
  first byte (or of the connection opening); otherwise 408 and close (slowloris);
- body idle timeout: once the headers are in, the body may not stall for longer than
  ``body_timeout_s`` between reads (nginx's ``client_body_timeout``); otherwise 408 and close
  (a ``Content-Length`` that promises more than is sent);
- header size: a request line and headers over ``max_header_bytes`` give 431 and close (checked
  per read while the headers are incomplete, and exactly when they end);
- chunk count: more than ``max_chunks`` chunks in one chunked body gives 400 and close (Triton's
  ``kMaxChunkedChunks`` of 65,536);
- ``Transfer-Encoding: chunked`` beside a ``Content-Length`` (what ``requests`` sends for a body the
  caller chunk-encoded, as Triton's L0_http ``test_content_encoding_chunked_manually`` does): the
  body is read as chunked, the ``Content-Length`` ignored, and the connection closed after the
  response (RFC 9112 section 6.1), where llhttp would answer 400; Triton's HTTP server (libevhtp)
  takes such a request too. A ``Transfer-Encoding`` whose last coding is not ``chunked`` is still
  400 and close;
- a client that disconnects cancels its request: when the connection is lost before the response
  is complete, the task running the application for it is cancelled, as gRPC cancels the call of a
  client that went away, so the request leaves the batch queue and its running execution is
  terminated (``kserve_v2.backend.cancellation``). Model control (``/v2/repository/...``) is left to finish
  what it started.

Per request this costs a few timestamps and counters and one wrapping coroutine; one watchdog timer
per connection checks the deadlines.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

if TYPE_CHECKING:  # uvicorn's ASGI types, as its protocol declares them
    from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection rules (seconds, bytes, counts); see the module docstring."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_chunks: int = 65_536


_IDLE, _HEADERS, _BODY = 0, 1, 2  # what a connection waits for: nothing (keep-alive), headers, body
_NOT_CANCELLED = "/v2/repository/"  # a load or unload runs to its end whoever waits for it


class _Rejected(Exception):
    """Raised inside a parser callback to stop parsing; the status is sent by ``send_400_response``."""


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol enforcing ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HttpToolsProtocol with a header deadline, a body idle timeout, header and chunk caps.

    One watchdog timer per connection checks the deadlines; a request only records timestamps.
    """

    limits: ConnectionLimits = ConnectionLimits()
    _watchdog: asyncio.TimerHandle | None = None
    _phase = _IDLE
    _since = 0.0  # when the headers began, or when body data last came
    _header_bytes = 0
    _chunks = 0
    _reject: tuple[int, str] | None = None
    _running: dict[RequestResponseCycle, asyncio.Task[None]] | None = None  # application runs of this connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # llhttp refuses Content-Length beside Transfer-Encoding; on_headers_complete lets only a chunked one through
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

    # asyncio types the argument BaseTransport; uvicorn narrows it to Transport (with the same ignore)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._phase, self._since = _HEADERS, self.loop.time()  # the first request's headers are due
        self._watchdog = self.loop.call_later(self.limits.header_timeout_s, self._check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        super().connection_lost(exc)
        for cycle, task in list((self._running or {}).items()):
            if not cycle.response_complete:  # nobody will read the response: stop the work (499 in spirit)
                cycle.disconnected = True
                task.cancel()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """uvicorn's start of a request's application run, through ``_cancellable``."""
        if cycle.scope["path"].startswith(_NOT_CANCELLED):
            super()._start_asgi_task(cycle, app)
        else:
            super()._start_asgi_task(cycle, partial(self._cancellable, cycle, app))

    async def _cancellable(self, cycle: RequestResponseCycle, app: ASGI3Application, scope: Scope,
                           receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        """Run ``app`` for ``cycle``, cancellable by ``connection_lost``; the cancellation that
        follows a disconnect ends the run quietly (uvicorn would log it as an application error)."""
        task = asyncio.current_task()
        assert task is not None
        if self._running is None:
            self._running = {}
        self._running[cycle] = task
        try:
            await app(scope, receive, send)
        except asyncio.CancelledError:
            if not cycle.disconnected:
                raise  # the server's own shutdown
            task.uncancel()
        finally:
            del self._running[cycle]

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _BODY:
            self._since = self.loop.time()  # body data came
        else:
            if phase == _IDLE:  # a keep-alive connection's next request begins
                self._phase, self._since = _HEADERS, self.loop.time()
            self._header_bytes += len(data)
        super().data_received(data)
        if self._phase == _HEADERS and self._header_bytes > self.limits.max_header_bytes:
            self._respond(431, f"request line and headers are over {self.limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        if self._header_bytes > self.limits.max_header_bytes and (  # the reads held more: count exactly
                len(self.url) + sum(len(name) + len(value) for name, value in self.headers) > self.limits.max_header_bytes):
            self._reject = (431, f"request line and headers are over {self.limits.max_header_bytes} bytes")
            raise _Rejected(self._reject[1])  # httptools stops parsing; uvicorn then calls send_400_response
        framed_twice = _framed_twice(self.headers)
        if framed_twice is None:
            self._reject = (400, "the request's Transfer-Encoding does not end with chunked")
            raise _Rejected(self._reject[1])
        self._phase, self._since = _BODY, self.loop.time()
        self._header_bytes = self._chunks = 0
        super().on_headers_complete()
        if framed_twice and self.cycle is not None and self.cycle.scope is self.scope:
            self.cycle.keep_alive = False  # RFC 9112 6.1: close after answering a request framed both ways
        if self.parser.should_upgrade():  # a WebSocket: the connection now belongs to uvicorn's WebSocket protocol
            self._phase = _IDLE
            if self._watchdog is not None:
                self._watchdog.cancel()

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > self.limits.max_chunks + 1:  # the last, empty chunk ends the body
            self._reject = (400, f"request body has more than {self.limits.max_chunks} chunks")
            raise _Rejected(self._reject[1])

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        super().on_message_complete()
        if not self.pipeline:  # the body is in: read on (uvicorn may have paused at its high-water mark), so
            self.flow.resume_reading()  # a client that disconnects is seen; a pipelined request pauses again

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; a rule broken in a callback answers with its own status."""
        status, text = self._reject or (400, msg)
        self._reject = None
        self._respond(status, text)

    # ---- helpers ---------------------------------------------------------------------------

    def _check(self) -> None:
        """The watchdog: answer 408 and close past a deadline, else look again when the next one is due."""
        now = self.loop.time()
        if self._phase == _BODY and self.flow.read_paused:
            self._since = now  # the application is not reading yet: the client is not the one stalling
        limit = self.limits.body_timeout_s if self._phase == _BODY else self.limits.header_timeout_s
        waited = now - self._since
        if self._phase != _IDLE and waited >= limit:
            self._watchdog = None
            self._respond(408, f"request headers not received within {limit:g} s" if self._phase == _HEADERS
                          else f"request body stalled for {limit:g} s")
            return
        self._watchdog = self.loop.call_later(limit - waited if self._phase != _IDLE else limit, self._check)

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


def _framed_twice(headers: list[tuple[bytes, bytes]]) -> bool | None:
    """How a request's headers (lower-case names) frame its body: True for a Content-Length beside a
    chunked Transfer-Encoding (the body is read as chunked); None for a Transfer-Encoding whose last
    coding is not ``chunked`` (400: its length cannot be known; llhttp's own check, which
    ``lenient_chunked_length`` turns off); False otherwise."""
    length = False
    codings: list[bytes] = []
    for name, value in headers:
        if name == b"content-length":
            length = True
        elif name == b"transfer-encoding":
            codings.extend(value.split(b","))
    if not codings:
        return False
    return length if codings[-1].strip().lower() == b"chunked" else None
