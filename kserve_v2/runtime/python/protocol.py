"""What the server and a python model's stub process say to each other (``kserve_v2.runtime.python.process``,
``kserve_v2.runtime.python.stub``), and ``Link``, the one socket both sides talk over.

Each message is a frozen dataclass. The server calls the stub (``Load``, ``AutoComplete``, ``Initialize``,
``Execute``, ``Finalize``); the stub calls the server for what model code asks of it (``Send``: a response
through a request's sender, ``Cancelled``, business logic scripting: ``Bls``, ``BlsStream``, ``BlsNext``,
``BlsCancel``, custom metrics: ``MetricFamily``, ``MetricOf``, ``MetricOp``, ``MetricFamilyGone``, and the
model loading API: ``Control``). Every call travels numbered, as ``(number, message)``, and is answered by
one ``Reply`` with its number: a value or an error's text. Tensors stay in the instance's shared memory
region (``kserve_v2.runtime.python.shm``): only their ``Slot`` travels, except where noted.

The wire is ``multiprocessing.connection.Connection``'s: length-prefixed pickles. ``workers.replicas.Link``
is not reused: it runs on an asyncio event loop, while both ends here are plain threads (the stub's model
code, the server's instance threads) that block on their calls.

Only numpy and the standard library are imported here (the stub process stays light).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from kserve_v2.runtime.python.shm import Slot

log = logging.getLogger(__name__)


class _Fields:
    """Pickled as its class and its fields' values: faster than the dataclasses' own pickling of frozen
    slotted classes, which looks up their fields each time."""

    __slots__: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return type(self), tuple([getattr(self, name) for name in self.__slots__])


@dataclass(frozen=True, slots=True)
class RequestData(_Fields):
    """A request of an ``Execute`` as it travels: its inputs are slots of the region."""

    request_id: str
    correlation_id: int | str
    flags: int
    parameters: dict[str, Any]
    inputs: list[Slot]
    output_names: list[str]


@dataclass(frozen=True, slots=True)
class ResponseData(_Fields):
    """A response as it travels: its outputs as slots of the region or, outside an execute (the server
    may be writing the region) and for business logic scripting, as ``(name, array)`` pairs pickled;
    its error ``(message, code)`` or None; its parameters."""

    outputs: list[Slot] | list[tuple[str, Any]]
    error: tuple[str, int] | None
    parameters: dict[str, bool | int | str]


@dataclass(frozen=True, slots=True)
class Executed(_Fields):
    """What an ``Execute`` gave: the region's size after it (bytes), which requests the model gave back
    to be executed again, and the responses it returned (None: it returned None; ``[]``: a decoupled
    model returned something, which the server refuses)."""

    size: int
    again: list[bool]
    responses: list[ResponseData | None] | None


# the server's calls, run by the stub one at a time on its main thread


@dataclass(frozen=True, slots=True)
class Load(_Fields):
    """Import the model file; replies whether its class has ``auto_complete_config``."""

    path: str
    model_name: str


@dataclass(frozen=True, slots=True)
class AutoComplete(_Fields):
    """Run ``auto_complete_config`` on ``config`` (Triton's JSON); replies the configuration it returned
    (a dict), or None when it returned no ``ModelConfig``."""

    config: str


@dataclass(frozen=True, slots=True)
class Initialize(_Fields):
    """Make the instance and run its ``initialize`` with Triton's ``args``."""

    args: dict[str, str]


@dataclass(frozen=True, slots=True)
class Execute(_Fields):
    """Run ``execute`` as ``execution`` on ``requests`` (the region holds ``size`` bytes); replies ``Executed``."""

    execution: int
    size: int
    requests: list[RequestData]


@dataclass(frozen=True, slots=True)
class Finalize(_Fields):
    """Run ``finalize``; the stub exits once it replied."""


# the stub's calls, as execution ``execution`` (None: outside execute) asked them


@dataclass(frozen=True, slots=True)
class Send(_Fields):
    """A response (None: only the flags) that the model sent for request ``index`` of ``execution``; the
    region holds ``size`` bytes. The reply's error is the one the model's ``send`` raises."""

    execution: int
    index: int
    response: ResponseData | None
    final: bool
    size: int


@dataclass(frozen=True, slots=True)
class Cancelled(_Fields):
    """Whether request ``index`` of ``execution`` is cancelled (or answered already)."""

    execution: int
    index: int


@dataclass(frozen=True, slots=True)
class Bls(_Fields):
    """Run a request the model built (``InferenceRequest(**fields)``, its inputs pickled); replies its ``ResponseData``."""

    execution: int | None
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BlsStream(_Fields):
    """Run a request to a decoupled model; replies the number of its response stream."""

    execution: int | None
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BlsNext(_Fields):
    """The next response of ``stream`` (``ResponseData``), or None at its end."""

    execution: int | None
    stream: int


@dataclass(frozen=True, slots=True)
class BlsCancel(_Fields):
    """Cancel the request of ``stream``."""

    execution: int | None
    stream: int


@dataclass(frozen=True, slots=True)
class MetricFamily(_Fields):
    """Create (or find) a custom metric family (``kind``: a ``MetricKind`` value); replies its number."""

    execution: int | None
    name: str
    description: str
    kind: int


@dataclass(frozen=True, slots=True)
class MetricOf(_Fields):
    """The series of family ``family`` with ``labels`` (``buckets``: a histogram's); replies its number."""

    execution: int | None
    family: int
    labels: dict[str, str]
    buckets: list[float] | None


@dataclass(frozen=True, slots=True)
class MetricOp(_Fields):
    """Apply ``operation`` (``increment``, ``set``, ``observe``, ``value``) to metric ``metric``; replies its result."""

    execution: int | None
    metric: int
    operation: str
    value: float | None


@dataclass(frozen=True, slots=True)
class MetricFamilyGone(_Fields):
    """The model deleted family ``family``: its metrics refuse their operations from now on."""

    execution: int | None
    family: int


@dataclass(frozen=True, slots=True)
class Control(_Fields):
    """A model loading API call: ``method`` (``load_model``, ``unload_model``, ``is_model_ready``) with its
    protobuf ``request``; replies its result."""

    execution: int | None
    method: str
    request: Any


@dataclass(frozen=True, slots=True)
class Reply(_Fields):
    """The answer to call ``number``: its ``value``, or the ``error`` text it failed with."""

    number: int
    value: Any = None
    error: str | None = None


ServerCall = Load | AutoComplete | Initialize | Execute | Finalize
StubCall = (Send | Cancelled | Bls | BlsStream | BlsNext | BlsCancel | MetricFamily | MetricOf | MetricOp
            | MetricFamilyGone | Control)
Message = ServerCall | StubCall
Handler = Callable[[int, Message], None]


class LinkClosed(Exception):
    """The other side went away (it died, or the socket was closed) before a call got its reply."""


class CallTimeout(Exception):
    """A call got no reply in the time it was given."""


class RemoteError(Exception):
    """The other side failed the call: ``text`` is its error's."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _Waiter:
    """A thread that waits on the link: for its call's reply, for an incoming call (``next_call``) or for
    the reader's role. Its lock, taken at first, is released by the thread that takes it out of
    ``Link._wanting``: with its reply, with the role (``lead``), or because the link closed."""

    __slots__ = ("lead", "lock", "reply")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.reply: Reply | None = None
        self.lead = False


class Link:
    """Numbered calls both ways over one connected socket, between threads: ``call`` sends a message and
    blocks its thread until the reply (any number of threads at once); incoming calls are taken one at a
    time by ``next_call`` (or handed to ``handle`` on a thread of the link's, ``serve``) and answered with
    ``reply`` or ``answer`` (at once, or later from another thread).

    No thread is the reader for good: the role passes between the threads that wait (leader and
    followers), so a thread whose reply is next reads it itself when no other thread reads, and one hand-off
    between threads is saved; the reader hands each reply and incoming call it reads to the thread that
    waits for it. When the socket closes or the other side dies, every call in flight raises
    ``LinkClosed``, ``next_call`` returns None, and ``closed()`` runs once.

    Args:
        sock: the connected socket (the link owns it).
        name: the name of the ``serve`` thread.
        closed: run once the link closed (on the thread that saw it).
    """

    def __init__(self, sock: socket.socket, name: str, closed: Callable[[], None] = lambda: None) -> None:
        self._socket = sock  # shut down to close: a thread blocked in recv wakes up
        self._conn = Connection(os.dup(sock.fileno()))
        self._closed_hook, self._name = closed, name
        self._write = threading.Lock()  # one frame at a time; the connection closes under it
        self._guard = threading.Lock()  # the state below changes under it
        self._reading = False  # a thread has the reader's role
        self._wanting: deque[_Waiter] = deque()  # threads blocked on their lock, each out of it once released
        self._waiting: dict[int, _Waiter] = {}  # calls in flight, by number
        self._incoming: deque[tuple[int, Message]] = deque()  # calls read, for next_call
        self._taker = _Waiter()  # the thread in next_call
        self._numbers = itertools.count()
        self._closed = False
        self._server: threading.Thread | None = None

    def serve(self, handle: Handler) -> None:
        """Hand each incoming call to ``handle(number, message)`` on a thread of the link's until it closes;
        ``handle`` must not wait for a call of its own."""
        def loop() -> None:
            while (call := self.next_call()) is not None:
                handle(*call)
        self._server = threading.Thread(target=loop, name=self._name, daemon=True)
        self._server.start()

    def next_call(self) -> tuple[int, Message] | None:
        """The next incoming call as ``(number, message)``, once it came; None once the link closed. One thread
        at a time takes calls."""
        me = self._taker
        while True:
            with self._guard:
                if self._incoming:
                    if me.lead:  # handed the role too: pass it on
                        me.lead = False
                        self._pass()
                    return self._incoming.popleft()
                if self._closed:
                    return None
                leading = self._lead_or_want(me)
            if leading:
                self._read(lambda: bool(self._incoming), None)
            else:
                me.lock.acquire()

    def call(self, message: Message, timeout: float | None = None) -> Any:
        """Send ``message`` and wait for its reply's value.

        Args:
            timeout: seconds to wait for the reply; None: as long as it takes.

        Raises:
            RemoteError: the other side failed the call (its text).
            LinkClosed: the other side went away first.
            CallTimeout: no reply within ``timeout``.
        """
        number = next(self._numbers)
        me = _Waiter()
        with self._guard:
            if self._closed:
                raise LinkClosed
            self._waiting[number] = me
        if not self._post((number, message)):
            with self._guard:
                self._waiting.pop(number, None)
            raise LinkClosed
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._guard:
                if me.reply is not None or self._closed:
                    if me.lead:
                        me.lead = False
                        self._pass()
                    break
                leading = self._lead_or_want(me)
            if leading:
                if not self._read(lambda: me.reply is not None, deadline):
                    with self._guard:
                        self._waiting.pop(number, None)
                    raise CallTimeout
            elif not me.lock.acquire(timeout=-1 if deadline is None else max(deadline - time.monotonic(), 0)):
                with self._guard:
                    woken = me.reply is not None or me.lead or self._closed  # its lock is released (or about to be)
                    if not woken:
                        self._wanting.remove(me)
                        self._waiting.pop(number, None)
                if not woken:
                    raise CallTimeout
                me.lock.acquire()
        reply = me.reply
        if reply is None:
            raise LinkClosed
        if reply.error is not None:
            raise RemoteError(reply.error)
        return reply.value

    def reply(self, reply: Reply) -> None:
        """Send the answer to an incoming call (dropped when the other side went away)."""
        self._post(reply)

    def answer(self, number: int, run: Callable[[], Any]) -> None:
        """Answer incoming call ``number`` with what ``run()`` returns, or the text of the exception it raised."""
        try:
            reply = Reply(number, run())
        except Exception as err:  # noqa: BLE001 - the caller raises it
            reply = Reply(number, error=str(err))
        self.reply(reply)

    def close(self, wait: float = 0) -> None:
        """Shut the socket down: the link closes, failing the calls in flight (the other side sees EOF).

        Args:
            wait: seconds to wait for the ``serve`` thread to have ended; never from ``handle``.
        """
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the other side closed it already
        self._socket.close()
        if wait and self._server is not None:
            self._server.join(wait)

    def _post(self, frame: tuple[int, Message] | Reply) -> bool:
        """Send one frame; False when the connection is closed. Plain pickles: ``Connection.send``'s
        pickler copies the copyreg table at each message."""
        data = pickle.dumps(frame, pickle.HIGHEST_PROTOCOL)
        try:
            with self._write:
                self._conn.send_bytes(data)
        except OSError:
            return False
        return True

    def _lead_or_want(self, me: _Waiter) -> bool:
        """Under the guard: whether ``me`` is the reader now (handed the role, or it was free); else it waits in line."""
        if me.lead:
            me.lead = False
            return True
        if not self._reading:
            self._reading = True
            return True
        self._wanting.append(me)
        return False

    def _wake(self, waiter: _Waiter) -> None:
        """Under the guard: release ``waiter`` when it waits in line (else it sees what changed by itself)."""
        if waiter in self._wanting:
            self._wanting.remove(waiter)
            waiter.lock.release()

    def _pass(self) -> None:
        """Under the guard: the reader gives its role to a thread in line, a call's first, or lets it go."""
        waiting = [waiter for waiter in self._wanting if waiter is not self._taker] or list(self._wanting)
        if waiting:
            waiting[0].lead = True
            self._wake(waiting[0])
        else:
            self._reading = False

    def _read(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """As the reader, take frames until ``done()``, handing each to the thread that waits for it, then pass
        the role on; False when ``deadline`` (``time.monotonic``) came first."""
        while True:
            try:
                if deadline is not None and not self._conn.poll(max(deadline - time.monotonic(), 0)):
                    with self._guard:
                        self._pass()
                    return False
                frame = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                self._end()
                return True
            except Exception:  # noqa: BLE001 - a frame that does not unpickle: the link is unusable
                log.exception("a message over the link '%s' failed to unpickle: closing it", self._name)
                self.close()
                self._end()
                return True
            with self._guard:
                if isinstance(frame, Reply):
                    waiter = self._waiting.pop(frame.number, None)
                    if waiter is not None:  # else its caller timed out
                        waiter.reply = frame
                        self._wake(waiter)
                else:
                    self._incoming.append(frame)
                    self._wake(self._taker)
                if done():
                    self._pass()
                    return True

    def _end(self) -> None:
        """The connection ended: close it, release every thread that waits, and run ``closed`` (once)."""
        with self._write:
            self._conn.close()
        with self._guard:
            if self._closed:
                return
            self._closed, self._reading = True, False
            waiting, self._wanting = list(self._wanting), deque()
        for waiter in waiting:
            waiter.lock.release()
        self._closed_hook()
