"""Heavy decoding and encoding off the event loop, so one large request never stalls the others.

gRPC and REST share one event loop. Small requests are decoded inline (no thread hop); a request
whose tensors carry ``HEAVY_BYTES`` or more, or ``HEAVY_ELEMENTS`` or more BYTES elements, is
decoded on a small bounded thread pool (Python-level loops there give the interpreter lock back
every switch interval, so the loop keeps answering). Work that runs long inside one C call holding
the interpreter lock (``json.loads``/``json.dumps`` of a large body) goes to a worker process
instead, started on first use (``spawn``: no fork of a threaded server) and replaced if it dies.
The pools are an ``Offload`` that the composition root builds and hands to the service and the
REST routes (nothing is created at import).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TypeVar

from kserve_v2.protocol.errors import TooLarge

T = TypeVar("T")

HEAVY_BYTES = 1 << 20
HEAVY_ELEMENTS = 1 << 14
DECODE_THREADS = 2
JSON_PROCESSES = 1


def is_heavy(nbytes: int, elements: int = 0) -> bool:
    """Whether work on ``nbytes`` bytes or ``elements`` BYTES elements leaves the event loop."""
    return nbytes >= HEAVY_BYTES or elements >= HEAVY_ELEMENTS


class Offload:
    """The decode thread pool and the JSON worker process of one server (see the module docstring).

    Args:
        threads: decode threads (at most this many heavy decodes and encodes at once).
        processes: JSON worker processes, started on first use.
    """

    def __init__(self, threads: int = DECODE_THREADS, processes: int = JSON_PROCESSES) -> None:
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")
        self._process_count = processes
        self._processes: ProcessPoolExecutor | None = None

    async def in_thread(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on the decode thread pool (callers run light work inline, without a coroutine)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, partial(work, *args))

    async def in_process(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` in the worker process (``work`` and its arguments and result must pickle;
        exceptions come back as raised).

        A worker that dies (killed, out of memory) is replaced, and the work tried once more.

        Raises:
            TooLarge: the worker died twice on this work -> RESOURCE_EXHAUSTED / 413.
        """
        for attempt in range(2):
            if self._processes is None:
                self._processes = ProcessPoolExecutor(max_workers=self._process_count,
                                                      mp_context=multiprocessing.get_context("spawn"))
            pool = self._processes
            try:
                return await asyncio.get_running_loop().run_in_executor(pool, partial(work, *args))
            except BrokenProcessPool:
                if self._processes is pool:
                    self._processes = None
                pool.shutdown(wait=False)
                if attempt:
                    raise TooLarge("the worker process decoding this request ended (out of memory?)") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop the pools once nothing runs on them (server exit); does not wait."""
        self._threads.shutdown(wait=False)
        if self._processes is not None:
            self._processes.shutdown(wait=False)
