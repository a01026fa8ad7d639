"""Worker replicas (``--workers N``): the link between the supervisor and each replica, and what
travels over it.

Each replica is a whole server (gRPC, REST, its models and batchers) in its own process; the
supervisor (``kserve_v2.workers.supervisor``) serves nothing on the request path. They talk over one Unix
socket pair per replica, made before the fork: length-prefixed pickles (``Link``), each a request
with an id and its reply, or a one-way notice. Over it:

- a replica asks the supervisor to run a ``Call`` on every replica (``ReplicaGroup.everywhere``:
  model control, shared memory registration, trace and log settings) or to collect one from each
  (``ReplicaGroup.gather``: statistics, metrics, status, the repository index);
- the supervisor asks a replica to apply a ``Call`` locally, and the replica answers its ``Outcome``;
- a replica reports its readiness (``ReplicaState``) and the supervisor tells every replica what
  the group looks like (``GroupView``: ready only when every replica is).

The handlers a replica applies are registered by kind (``ReplicaGroup.handle``) by the modules
that own what they change (``kserve_v2.workers.replicated``, the composition root). Nothing here imports a
transport.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kserve_v2.protocol.errors import InternalError, ServerError, Unavailable

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!Q")
_REQUEST, _REPLY, _NOTICE = 0, 1, 2
Handler = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Call:
    """One operation a replica applies: its handler's ``kind`` and the handler's ``payload``
    (protobuf messages and plain values; they must pickle).

    Attributes:
        key: what the call sets, for the supervisor's log of control calls that a restarted
            replica replays: a later call with the same key replaces an earlier one; None: kept.
        logged: whether a restarted replica must replay it (model control and settings are; a poll
            change is not, since a new replica reads the repository as it is).
        model: the model whose readiness the call may change (``ReplicaGroup.changed``).
    """

    kind: str
    payload: Any = None
    key: str | None = None
    logged: bool = True
    model: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What applying a ``Call`` on one replica gave: its ``value``, or its ``error`` (a
    ``ServerError``), and the calls that would take back what it changed (``undo``), which the
    supervisor applies everywhere when the call failed on some replicas and not on others."""

    value: Any = None
    error: ServerError | None = None
    undo: tuple[Call, ...] = ()

    def result(self) -> Any:
        """The value; raises the error."""
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True)
class ReplicaState:
    """What a replica reports about itself whenever it changes.

    Attributes:
        started: its startup loading has ended.
        ready: its own readiness (``InferenceService.is_ready`` of this process alone).
        models: model name -> its READY versions.
    """

    started: bool = False
    ready: bool = False
    models: Mapping[str, frozenset[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupView:
    """What the supervisor tells every replica about all of them.

    Attributes:
        ready: every replica serving is ready (and the first startup of all of them has ended).
        unsettled: models whose READY versions differ between replicas (a load or unload under
            way): not ready as one server.
        replicas: replicas serving.
        restarts: replicas restarted after they died, since the server started.
        changing: the model of the control call under way on the group (``Call.model``), from
            before any replica applies it until every replica has.
    """

    ready: bool = False
    unsettled: frozenset[str] = frozenset()
    replicas: int = 0
    restarts: int = 0
    changing: str | None = None


def as_server_error(err: BaseException) -> ServerError:
    """``err`` as the error a client sees (anything but a ``ServerError`` is INTERNAL)."""
    return err if isinstance(err, ServerError) else InternalError(f"{type(err).__name__}: {err}")


class Link:
    """One end of a supervisor-replica socket: requests with replies, and notices.

    Args:
        serve: answers a request of the other end: ``serve(kind, payload)``; its exception goes
            back as the reply's error.
        notice: takes a notice of the other end: ``notice(kind, payload)``.
    """

    def __init__(self, serve: Callable[[str, Any], Awaitable[Any]], notice: Callable[[str, Any], None]) -> None:
        self._serve = serve
        self._notice = notice
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._early: list[bytes] | None = []  # sent before the connection was up; None once it is
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, sock: socket.socket) -> None:
        """Read and dispatch messages until the other end closes; requests still waiting then fail
        with ``Unavailable``."""
        reader, self._writer = await asyncio.open_connection(sock=sock, limit=2**20)
        for frame in self._early or ():
            self._writer.write(frame)
        self._early = None
        try:
            while True:
                try:
                    size = _HEADER.unpack(await reader.readexactly(_HEADER.size))[0]
                    message = pickle.loads(await reader.readexactly(size))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self._dispatch(message)
        finally:
            self._writer.close()
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(Unavailable("the replica link closed (the other process exited)"))
            self._waiting.clear()

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        if message[0] == _REPLY:
            _, number, ok, value = message
            waiting = self._waiting.pop(number, None)
            if waiting is not None and not waiting.done():
                if ok:
                    waiting.set_result(value)
                else:
                    waiting.set_exception(value)
        elif message[0] == _REQUEST:
            task = asyncio.get_running_loop().create_task(self._answer(message[1], message[2], message[3]))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)
        else:
            self._notice(message[1], message[2])

    async def _answer(self, number: int, kind: str, payload: Any) -> None:
        try:
            reply: tuple[Any, ...] = (_REPLY, number, True, await self._serve(kind, payload))
        except Exception as err:  # noqa: BLE001 - every failure goes back to the asker
            reply = (_REPLY, number, False, as_server_error(err))
        try:
            self._send(reply)
        except Unavailable:
            pass  # the asker has gone: nobody waits for the answer

    async def request(self, kind: str, payload: Any = None) -> Any:
        """Ask the other end and wait for its answer.

        Raises:
            The other end's error (a ``ServerError``); Unavailable when the link closes first.
        """
        number = next(self._ids)
        waiting = self._waiting[number] = asyncio.get_running_loop().create_future()
        self._send((_REQUEST, number, kind, payload))
        return await waiting

    def notify(self, kind: str, payload: Any = None) -> None:
        """Tell the other end, without an answer."""
        self._send((_NOTICE, kind, payload))

    def _send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if self._early is not None:  # ``run`` has not connected yet: it sends these first
            self._early.append(_HEADER.pack(len(data)) + data)
        elif self._writer is None or self._writer.is_closing():
            raise Unavailable("the replica link is closed")
        else:
            self._writer.write(_HEADER.pack(len(data)) + data)


class ReplicaGroup:
    """This replica's side of the group: calls that must reach every replica, what the group
    looks like, and the handlers for what the supervisor asks this replica to apply.

    Args:
        index: this replica's number (0 to N - 1); replica 0 runs the group's repository poll.
        sock: this replica's end of its socket pair with the supervisor.
        restarted: this replica replaces one that died: it opens its ports only once it has
            caught up with the others (``join``).
    """

    def __init__(self, index: int, sock: socket.socket, restarted: bool) -> None:
        self.index = index
        self.restarted = restarted
        self.view = GroupView()
        self.on_view: Callable[[], None] = lambda: None  # called when ``view`` changes
        self.on_lost: Callable[[], None] = lambda: None  # called when the supervisor has gone
        self._sock = sock
        self._handlers: dict[str, Handler] = {}
        self._link = Link(self._serve, self._notice)
        self._reader: asyncio.Task[None] | None = None
        self._versions: Callable[[str], frozenset[int]] = lambda _: frozenset()
        self._before: tuple[str, frozenset[int]] | None = None  # the changing model's READY versions before

    def start(self) -> None:
        """Start reading the link (on the running loop); ``on_lost`` is called when it closes (the
        supervisor stays until its replicas have exited, so it has died)."""
        self._reader = asyncio.get_running_loop().create_task(self._link.run(self._sock))
        self._reader.add_done_callback(lambda _: self.on_lost())

    def handle(self, kind: str, handler: Handler) -> None:
        """Apply calls of ``kind`` with ``handler(payload)``, which returns its value or an
        ``Outcome`` (for calls that can be taken back: ``Outcome.undo``)."""
        self._handlers[kind] = handler

    def track(self, versions: Callable[[str], frozenset[int]]) -> None:
        """Read this replica's READY versions of a model with ``versions(name)`` (for ``changed``)."""
        self._versions = versions

    def changed(self, name: str) -> bool:
        """Whether this replica has already applied a control call that changes ``name``'s READY
        versions while the group's call is still under way: the supervisor learns of it only
        afterwards, so until every replica has applied it the model is not ready as one server."""
        before = self._before
        return (before is not None and before[0] == name == self.view.changing
                and self._versions(name) != before[1])

    async def everywhere(self, call: Call) -> Any:
        """Apply ``call`` on every replica, one control call at a time for the whole group; returns
        the value once every replica has applied it.

        Raises:
            The error of a replica where it failed; the supervisor has then made every replica
            alike again (``Outcome.undo``).
        """
        outcome: Outcome = await self._link.request("everywhere", call)
        return outcome.result()

    async def gather(self, call: Call) -> list[Outcome]:
        """Apply ``call`` on every replica serving (this one included) and return each outcome."""
        outcomes: list[Outcome] = await self._link.request("gather", call)
        return outcomes

    async def join(self) -> None:
        """Tell the supervisor this replica's startup has ended; returns once it has applied the
        control calls the group took while it was starting and counts as serving."""
        await self._link.request("join")

    def report(self, state: ReplicaState) -> None:
        """Tell the supervisor this replica's state (sent only when the link is up)."""
        try:
            self._link.notify("state", state)
        except Unavailable:
            pass  # the link is not up yet, or the supervisor is gone: nothing to tell

    async def _serve(self, kind: str, payload: Any) -> Any:
        if kind != "apply":
            raise InternalError(f"a replica cannot answer '{kind}'")
        call: Call = payload
        if call.model is not None:
            self._before = (call.model, self._versions(call.model))
        handler = self._handlers.get(call.kind)
        if handler is None:
            return Outcome(error=InternalError(f"this replica has no handler for '{call.kind}'"))
        try:
            result = await handler(call.payload)
        except Exception as err:  # noqa: BLE001 - a failed apply is an outcome
            return Outcome(error=as_server_error(err))
        return result if isinstance(result, Outcome) else Outcome(result)

    def _notice(self, kind: str, payload: Any) -> None:
        if kind == "view" and payload != self.view:
            self.view = payload
            self.on_view()
