"""Peer server processes started by the benchmarks: waiting for them to answer, and forking a
ceiling into several processes on one port."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent exits


def wait_http(proc: subprocess.Popen, url: str, log: Path, what: str, seconds: float = 120) -> None:
    """Return once ``url`` answers 2xx; exit with the log's tail if ``proc`` dies or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"{what} did not become ready:\n{log.read_text()[-3000:]}")


def fork_workers(count: int) -> int:
    """Go on as ``count`` processes (this one and ``count - 1`` forks, which end with it); returns
    this process's number, 0 for the original. Call it before creating sockets, loops or gRPC objects."""
    for index in range(1, count):
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            return index
    return 0
