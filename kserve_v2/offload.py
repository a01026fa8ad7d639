"""Heavy decoding and encoding off the event loop, so one large request never stalls the others.

gRPC and REST share one event loop. Small requests are decoded inline (no thread hop); a request
whose tensors carry ``HEAVY_BYTES`` or more, or ``HEAVY_ELEMENTS`` or more BYTES elements, is
decoded on a small bounded thread pool (Python-level loops there give the interpreter lock back
every switch interval, so the loop keeps answering). Work that runs long inside one C call holding
the interpreter lock (``json.loads``/``json.dumps`` of a large body) goes to a worker process
instead, started on first use (``spawn``: no fork of a threaded server) and replaced if it dies.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TypeVar

from kserve_v2.errors import TooLarge

T = TypeVar("T")

HEAVY_BYTES = 1 << 20
HEAVY_ELEMENTS = 1 << 14
DECODE_THREADS = 2
JSON_PROCESSES = 1

_threads = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="decode")
_processes: ProcessPoolExecutor | None = None


def is_heavy(nbytes: int, elements: int = 0) -> bool:
    """Whether work on ``nbytes`` bytes or ``elements`` BYTES elements leaves the event loop."""
    return nbytes >= HEAVY_BYTES or elements >= HEAVY_ELEMENTS


async def in_thread(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` on the decode thread pool (callers run light work inline, without a coroutine)."""
    return await asyncio.get_running_loop().run_in_executor(_threads, partial(work, *args))


async def in_process(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in the worker process (``work`` and its arguments and result must pickle;
    exceptions come back as raised).

    A worker that dies (killed, out of memory) is replaced, and the work tried once more.

    Raises:
        TooLarge: the worker died twice on this work -> RESOURCE_EXHAUSTED / 413.
    """
    global _processes
    for attempt in range(2):
        if _processes is None:
            _processes = ProcessPoolExecutor(max_workers=JSON_PROCESSES, mp_context=multiprocessing.get_context("spawn"))
        pool = _processes
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, partial(work, *args))
        except BrokenProcessPool:
            if _processes is pool:
                _processes = None
            pool.shutdown(wait=False)
            if attempt:
                raise TooLarge("the worker process decoding this request ended (out of memory?)") from None
    raise AssertionError("unreachable")
