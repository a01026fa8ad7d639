"""Cancellation of a running execution, from the event loop to the backend's thread.

A request that is cancelled (the client went away) or expires (its gRPC deadline passed) stops
waiting at once; its execution, when already running on an instance thread, is told through a
``Cancellation`` that the backend registers a hook on (ONNX Runtime: ``RunOptions.terminate``,
checked between graph nodes), so the instance is free again instead of computing for no one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Cancellation:
    """A flag plus the hooks a backend registered to stop its work (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self.cancelled = False

    def cancel(self) -> None:
        """Set the flag and run every hook (from any thread)."""
        with self._lock:
            self.cancelled = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on cancellation (at once if already cancelled)."""
        with self._lock:
            if not self.cancelled:
                self._hooks.append(hook)
                return
        hook()


class _Current(threading.local):
    # a class default: a thread that never set one reads None without an AttributeError
    # (``getattr`` with a default builds the error and its message first)
    cancellation: Cancellation | None = None


_local = _Current()


def current() -> Cancellation | None:
    """The cancellation of the execution running on this thread, if any."""
    return _local.cancellation


def running(cancellation: Cancellation | None) -> None:
    """Make ``cancellation`` this thread's current one (None when the execution ends)."""
    _local.cancellation = cancellation
