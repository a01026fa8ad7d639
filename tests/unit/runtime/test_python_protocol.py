"""The link between the server and a python model's stub process (``kserve_v2.runtime.python.protocol``):
numbered calls both ways answered by their replies, many threads at once (with a thread serving the
incoming calls, and with callers that read their own replies, as the stub's threads do), an error's
text, a reply that comes too late, and every call in flight failing when the other side goes away."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kserve_v2.runtime.python.protocol import (CallTimeout, Cancelled, Link, LinkClosed, Load, Message, MetricOp,
                                               RemoteError, Reply)


class Side:
    """One end: answers ``Cancelled`` at once (true when its index is odd), fails ``Load`` with its path,
    and holds ``MetricOp`` calls until ``release`` is set (or answers them late by hand)."""

    def __init__(self, sock: socket.socket) -> None:
        self.release = threading.Event()
        self.held = threading.Semaphore(0)  # one per call held
        self.closed = threading.Event()
        self.link = Link(sock, "test-link", self.closed.set)
        self.link.serve(self._take)

    def _take(self, number: int, message: Message) -> None:
        match message:
            case Cancelled(_, index):
                self.link.reply(Reply(number, index % 2 == 1))
            case Load(path, _):
                self.link.answer(number, lambda: _raise(path))
            case MetricOp():
                self.held.release()
                threading.Thread(target=self._late, args=(number,)).start()

    def _late(self, number: int) -> None:
        if self.release.wait(10):
            self.link.reply(Reply(number, "late"))


def _raise(text: str) -> None:
    raise ValueError(text)


@pytest.fixture()
def sides() -> Iterator[tuple[Side, Side]]:
    a, b = socket.socketpair()
    pair = Side(a), Side(b)
    yield pair
    for side in pair:
        side.release.set()
        side.link.close(wait=5)


def test_calls_both_ways_from_many_threads_get_their_own_replies(sides: tuple[Side, Side]) -> None:
    server, stub = sides
    with ThreadPoolExecutor(8) as pool:
        ours = list(pool.map(lambda i: server.link.call(Cancelled(0, i)), range(200)))
        theirs = list(pool.map(lambda i: stub.link.call(Cancelled(0, i)), range(200)))
    assert ours == theirs == [i % 2 == 1 for i in range(200)]


def test_a_failed_call_raises_the_other_sides_text(sides: tuple[Side, Side]) -> None:
    with pytest.raises(RemoteError, match="^no such file$"):
        sides[0].link.call(Load("no such file", "m"))


def test_a_call_without_a_reply_in_time_times_out_and_its_late_reply_is_dropped(sides: tuple[Side, Side]) -> None:
    server, stub = sides
    with pytest.raises(CallTimeout):
        server.link.call(MetricOp(None, 0, "value", None), timeout=0.2)
    stub.release.set()
    assert server.link.call(Cancelled(0, 1)) is True  # the late reply went nowhere: the link serves on


def test_every_call_in_flight_fails_when_the_other_side_goes_away(sides: tuple[Side, Side]) -> None:
    server, stub = sides
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(server.link.call, MetricOp(None, i, "value", None)) for i in range(4)]
        assert all(stub.held.acquire(timeout=10) for _ in range(4))
        stub.link.close()
        for call in calls:
            with pytest.raises(LinkClosed):
                call.result(timeout=10)
    assert server.closed.wait(10) and stub.closed.wait(10)
    with pytest.raises(LinkClosed):
        server.link.call(Cancelled(0, 1))


def test_callers_read_their_own_replies_while_one_thread_takes_the_calls() -> None:
    """The stub's way: its main thread takes the server's calls with ``next_call`` (reading the link while
    it waits), its other threads call meanwhile, reading replies for each other."""
    a, b = socket.socketpair()
    server = Side(a)
    stub = Link(b, "test-stub")
    taken: list[Message] = []

    def main() -> None:
        while (call := stub.next_call()) is not None:
            number, message = call
            taken.append(message)
            stub.reply(Reply(number, "done"))

    thread = threading.Thread(target=main)
    thread.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            asked = pool.map(lambda i: stub.call(Cancelled(0, i)), range(300))
            told = pool.map(lambda i: server.link.call(Cancelled(1, i)), range(300))
            assert list(asked) == [i % 2 == 1 for i in range(300)] and list(told) == ["done"] * 300
        assert sorted(m.index for m in taken if isinstance(m, Cancelled)) == list(range(300))
    finally:
        server.link.close(wait=5)
        thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(LinkClosed):
        stub.call(Cancelled(0, 1))
