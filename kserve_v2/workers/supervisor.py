"""The supervisor of ``--workers N``: N replica processes behind the same ports, kept alike.

The supervisor reserves the ports (``kserve_v2.host.ports``), forks the replicas, and then serves
nothing on the request path; each replica binds its own sockets with ``SO_REUSEPORT`` and creates
its gRPC objects after the fork. Over each replica's link (``kserve_v2.workers.replicas``) it:

- runs control calls on every replica, one at a time for the whole group (``everywhere``): the
  call answers once every replica has applied it; when it failed on some replicas and not on
  others, the calls that take it back (``Outcome.undo``) run on every replica, and the error is
  the answer, so no replica is left different from the others;
- keeps those calls (``ControlLog``) and replays them to a replica that replaces one that died,
  before that replica opens its ports (``join``);
- collects per-replica answers for observers (``gather``: statistics, metrics, status, index);
- tells every replica what the group looks like (``GroupView``): ready only when every replica is.

Lifecycle: SIGTERM or SIGINT is passed to every replica, which drains as one server does; the
supervisor exits once they all have. A replica that dies is logged and replaced (the count is
``GroupView.restarts``, exported as a metric); one that dies during the first startup stops the
server with its exit code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from kserve_v2.host.ports import reserve
from kserve_v2.protocol.errors import InternalError, Unavailable
from kserve_v2.settings.server import Settings
from kserve_v2.workers.replicas import Call, GroupView, Link, Outcome, ReplicaState

log = logging.getLogger(__name__)

# a replica that dies sooner than this after it started is restarted after RESTART_DELAY_S, not at once
SHORT_LIFE_S = 10.0
RESTART_DELAY_S = 1.0
# seconds a replica has to answer a gather (statistics, metrics, status, index) before it is left out
GATHER_TIMEOUT_S = 10.0
# (start, index, socket, restarted) -> exit code: runs one replica in the forked child
StartReplica = Callable[[int, socket.socket, bool], int]


class ControlLog:
    """The control calls the group has applied, in order, for a replica that joins later.

    A call with a ``key`` replaces the earlier calls with that key (a later load of a model
    supersedes its earlier loads and unloads); a key ending in ``*`` replaces every key it prefixes
    (unregistering every shared memory region). Calls with ``logged`` false are not kept.
    """

    def __init__(self) -> None:
        self._calls: list[Call] = []

    def add(self, call: Call) -> None:
        """Keep ``call`` (see the class docstring)."""
        if not call.logged:
            return
        key = call.key
        if key is not None:
            self._calls = [c for c in self._calls if not _replaces(key, c.key)]
        self._calls.append(call)

    def calls(self) -> list[Call]:
        """The calls to replay, oldest first."""
        return list(self._calls)


def _replaces(key: str, earlier: str | None) -> bool:
    if earlier is None:
        return False
    return earlier.startswith(key[:-1]) if key.endswith("*") else earlier == key


@dataclass(eq=False)
class _Replica:
    index: int
    pid: int
    sock: socket.socket  # the supervisor's end of the link
    initial: bool  # started with the server (not a replacement)
    started_at: float
    link: Link | None = None
    reader: asyncio.Task[None] | None = None  # held: a forked child must not drop it (it would warn)
    joined: bool = False
    state: ReplicaState = field(default_factory=ReplicaState)


class Supervisor:
    """Starts, links and replaces the replicas (see the module docstring).

    Args:
        workers: replicas.
        start: runs one replica in the forked child and returns its exit code.
        reserved: the sockets holding the shared ports (closed in the replicas).
    """

    def __init__(self, workers: int, start: StartReplica, reserved: Sequence[socket.socket] = ()) -> None:
        self._workers = workers
        self._start = start
        self._reserved = list(reserved)
        self._replicas: dict[int, _Replica] = {}
        self._log = ControlLog()
        self._view = GroupView()
        self._changing: str | None = None  # the model of the control call under way (``Call.model``)
        self._restarts = 0
        self._stopping = False
        self._exit_code = 0
        self._announced = False
        self._due: list[int] = []  # replica indexes to fork when the loop next stops
        # poll(2), not epoll: an epoll instance is shared with every forked child, and a child closing
        # its copy of the loop would unregister the supervisor's own descriptors from it
        self._loop = asyncio.SelectorEventLoop(selectors.PollSelector())
        self._wake = asyncio.Event()
        self._control = asyncio.Lock()
        self._started = asyncio.Event()  # every replica of the first generation has joined

    def run(self) -> int:
        """Run until the replicas have stopped; returns the server's exit code.

        Forks happen while the event loop is stopped, so a replica starts with no running loop
        (it closes the supervisor's loop and makes its own).
        """
        loop = self._loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        loop.add_signal_handler(signal.SIGCHLD, self._reap)
        self._due = list(range(self._workers))
        try:
            while not (self._stopping and not self._replicas):
                for index in self._due:
                    if not self._stopping:
                        self._fork(index, restarted=self._restarts > 0 or index in self._replicas)
                self._due.clear()
                self._wake.clear()
                loop.run_until_complete(self._wake.wait())
        finally:
            loop.close()
        log.info("server stopped")
        return self._exit_code

    # ---- processes ----------------------------------------------------------------------------

    def _fork(self, index: int, restarted: bool) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the replica
            code = 1
            try:
                ours.close()
                for sock in [r.sock for r in self._replicas.values()] + self._reserved:
                    sock.close()  # the same objects asyncio's transports hold: nothing closes them twice
                self._loop.close()  # the supervisor's: its selector, self-pipe and signal handlers
                asyncio.set_event_loop(None)
                code = self._start(index, theirs, restarted)
            except BaseException:  # noqa: BLE001 - the replica ends here, whatever happened
                log.exception("replica %d failed", index)
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # never return into the supervisor's frames
        theirs.close()
        replica = _Replica(index, pid, ours, initial=not restarted, started_at=time.monotonic())
        replica.link = Link(partial(self._serve, replica), partial(self._notice, replica))
        self._replicas[index] = replica
        replica.reader = self._loop.create_task(replica.link.run(ours))
        log.info("replica %d started (pid %d)", index, pid)

    def _reap(self) -> None:
        """SIGCHLD: collect every replica that has exited."""
        for replica in list(self._replicas.values()):
            try:
                pid, status = os.waitpid(replica.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = replica.pid, 0
            if pid:
                self._exited(replica, os.waitstatus_to_exitcode(status))

    def _exited(self, replica: _Replica, code: int) -> None:
        del self._replicas[replica.index]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if self._stopping:
            log.info("replica %d (pid %d) %s", replica.index, replica.pid, how)
            self._wake.set()
            return
        if replica.initial and not replica.joined:
            log.error("replica %d (pid %d) %s during startup: stopping the server", replica.index, replica.pid, how)
            self._exit_code = code if code > 0 else 1
            self._stop()
            return
        self._restarts += 1
        delay = RESTART_DELAY_S if time.monotonic() - replica.started_at < SHORT_LIFE_S else 0.0
        log.error("replica %d (pid %d) %s; starting a replacement%s (restarts so far: %d)", replica.index,
                  replica.pid, how, f" in {delay:.0f} s" if delay else "", self._restarts)
        self._publish()
        self._loop.call_later(delay, self._restart, replica.index)

    def _restart(self, index: int) -> None:
        self._due.append(index)
        self._wake.set()

    def _stop(self) -> None:
        """SIGTERM / SIGINT: every replica drains and exits; then so does the supervisor."""
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down: passing SIGTERM to %d replicas", len(self._replicas))
        for replica in self._replicas.values():
            try:
                os.kill(replica.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._wake.set()

    # ---- the links ----------------------------------------------------------------------------

    async def _serve(self, replica: _Replica, kind: str, payload: Any) -> Any:
        if kind == "everywhere":
            return await self._everywhere(payload)
        if kind == "gather":
            return await self._gather(replica, payload)
        if kind == "join":
            return await self._join(replica)
        raise InternalError(f"the supervisor cannot answer '{kind}'")

    def _notice(self, replica: _Replica, kind: str, payload: Any) -> None:
        if kind == "state":
            replica.state = payload
            self._publish()

    def _members(self) -> list[_Replica]:
        """The replicas serving: joined and not exited."""
        return [r for r in self._replicas.values() if r.joined]

    async def _apply(self, targets: Sequence[_Replica], call: Call, timeout: float | None = None
                     ) -> list[Outcome | None]:
        """``call`` applied on each target, at once; None for a replica that exited meanwhile (or,
        with a ``timeout`` in seconds, did not answer in time)."""
        results = await asyncio.gather(*(asyncio.wait_for(r.link.request("apply", call), timeout)
                                         for r in targets if r.link is not None), return_exceptions=True)
        return [r if isinstance(r, Outcome) else None for r in results]

    async def _everywhere(self, call: Call) -> Outcome:
        await self._started.wait()  # a call during the first startup waits for it to end
        async with self._control:
            targets = self._members()
            if not targets:
                return Outcome(error=Unavailable("no replica is serving"))
            # the view naming the model goes out before the call on each link (``ReplicaGroup.changed``)
            self._changing = call.model
            self._publish()
            try:
                return await self._apply_everywhere(targets, call)
            finally:
                self._changing = None
                self._publish()

    async def _apply_everywhere(self, targets: list[_Replica], call: Call) -> Outcome:
        outcomes = [o for o in await self._apply(targets, call) if o is not None]
        self._log.add(call)
        failed = [o for o in outcomes if o.error is not None]
        succeeded = [o for o in outcomes if o.error is None]
        if not failed or not succeeded:
            return (failed or outcomes or [Outcome(error=Unavailable("no replica is serving"))])[0]
        undo: list[Call] = []
        for outcome in succeeded:
            undo += [c for c in outcome.undo if c not in undo]
        log.warning("'%s' failed on %d of %d replicas (%s); taking it back on every replica", call.kind,
                    len(failed), len(outcomes), failed[0].error)
        for back in undo:
            await self._apply(self._members(), back)
            self._log.add(back)
        return failed[0]

    async def _gather(self, origin: _Replica, call: Call) -> list[Outcome]:
        targets = self._members()
        if origin not in targets and origin.index in self._replicas:
            targets.append(origin)  # a replica still starting answers for itself
        return [o for o in await self._apply(targets, call, GATHER_TIMEOUT_S) if o is not None]

    async def _join(self, replica: _Replica) -> None:
        """Bring a replica whose startup has ended up to date and count it as serving."""
        async with self._control:
            calls = self._log.calls()
            for call in calls:
                outcome = (await self._apply([replica], call))[0]
                if outcome is not None and outcome.error is not None:
                    log.info("replica %d replaying '%s': %s", replica.index, call.kind, outcome.error)
            if calls:
                log.info("replica %d applied the %d control calls it missed", replica.index, len(calls))
            replica.joined = True
        if not self._started.is_set() and all(r.joined for r in self._replicas.values()):
            self._started.set()
        self._publish()

    def _publish(self) -> None:
        """Work out the group view; send it to every replica when it changed."""
        members = self._members()
        ready = self._started.is_set() and bool(members) and all(r.state.ready for r in members)
        names = {name for r in members for name in r.state.models}
        unsettled = frozenset(name for name in names
                              if len({r.state.models.get(name, frozenset()) for r in members}) > 1)
        view = GroupView(ready, unsettled, len(members), self._restarts, self._changing)
        if view != self._view:
            self._view = view
            for replica in self._replicas.values():
                if replica.link is not None:
                    try:
                        replica.link.notify("view", view)
                    except Unavailable:
                        pass  # exiting: its reaping follows
        if not self._announced and self._started.is_set() and all(r.state.started for r in members):
            self._announced = True
            if ready:
                log.info("server is ready (%d replicas)", len(members))
            else:
                log.warning("server is live but not ready: a startup model failed to load (see RepositoryIndex)")


def reserve_ports(settings: Settings) -> tuple[Settings, list[socket.socket]]:
    """Hold the ports the replicas will share (``kserve_v2.host.ports.reserve``): the settings with every
    port 0 resolved to the free port held, and the holding sockets.

    Raises:
        OSError: a port is in use or its address cannot be bound.
    """
    held: list[socket.socket] = []

    def hold(address: str, port: int, wanted: bool = True) -> int:
        if not wanted:
            return port
        held.append(reserve(address, port))
        bound: int = held[-1].getsockname()[1]
        return bound

    try:
        resolved = replace(settings, grpc_port=hold(settings.grpc_address, settings.grpc_port),
                           http_port=hold(settings.http_address, settings.http_port, settings.allow_http),
                           metrics_port=hold(settings.metrics_address, settings.metrics_port, settings.allow_metrics))
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return resolved, held
