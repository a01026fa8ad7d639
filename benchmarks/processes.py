"""Peer server processes started by the benchmarks: waiting for them to answer."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path


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
