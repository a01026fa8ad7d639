"""A clock the scheduling unit tests move by hand (the ``clock`` of ``PriorityQueue`` and
``DynamicBatcher``): timeouts pass when a test says so, never by sleeping."""

from __future__ import annotations


class FakeClock:
    """Nanoseconds that stand still until ``advance``."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, microseconds: int) -> None:
        self.now_ns += microseconds * 1000
