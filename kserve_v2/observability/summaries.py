"""Prometheus summaries whose quantiles cover a sliding time window, computed with numpy and exported
through prometheus-client's ``SummaryMetricFamily``.

The window is Prometheus' time-window quantiles (prometheus-cpp's, which Triton's summaries use):
``max_age`` seconds split into ``age_buckets`` slots; a query reads the values of the last
``age_buckets`` slots, so it covers between ``max_age * (1 - 1/age_buckets)`` and ``max_age``
seconds. Quantiles are exact over the values kept (``numpy.quantile``, ``inverted_cdf``: an
observed value, as a CKMS estimate is), which meets any allowed error; a slot keeps at most
``MAX_KEPT`` values, a uniform sample of its values beyond that (reservoir sampling). ``_count``
and ``_sum`` count every value since start. Observations arrive in arrays (``InferenceMetrics``
folds its requests in bulk), so a request costs a share of one numpy call, not a Python loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np
from prometheus_client.core import SummaryMetricFamily

from kserve_v2.settings.metrics_config import DEFAULT_QUANTILES

MAX_KEPT = 1 << 14  # values a slot keeps (a scrape sorts at most age_buckets times as many)
_Labels = TypeVar("_Labels", bound=tuple[str, ...])  # one series' label values
_RANDOM = np.random.default_rng()


class WindowQuantiles:
    """Values observed over a sliding window, and the running count and sum of all of them.

    Args:
        max_age_s: the window, in seconds.
        age_buckets: slots the window is made of.
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(self, max_age_s: float, age_buckets: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        self._period = max_age_s / age_buckets
        self._clock = clock
        self._slots: list[_Slot] = [_Slot() for _ in range(age_buckets)]
        self._current = 0
        self._rotated = clock()
        self.count = 0
        self.sum = 0.0

    def observe(self, values: np.ndarray) -> None:
        """Add values (a 1-D float array)."""
        self._rotate()
        self._slots[self._current].add(values)
        self.count += len(values)
        self.sum += float(values.sum())

    def query(self, quantiles: Sequence[float]) -> list[float]:
        """The quantiles of the window's values (NaN each when it has none)."""
        self._rotate()
        values = np.concatenate([slot.kept for slot in self._slots])
        if not len(values):
            return [math.nan] * len(quantiles)
        return [float(v) for v in np.quantile(values, quantiles, method="inverted_cdf")]

    def _rotate(self) -> None:
        """Start a fresh slot for each period gone by (emptying the oldest)."""
        elapsed = int((self._clock() - self._rotated) // self._period)
        for _ in range(min(elapsed, len(self._slots))):
            self._current = (self._current + 1) % len(self._slots)
            self._slots[self._current] = _Slot()
        self._rotated += elapsed * self._period


class _Slot:
    """The values of one period: all of them up to ``MAX_KEPT``, then a uniform sample."""

    __slots__ = ("kept", "seen")

    def __init__(self) -> None:
        self.kept = np.empty(0, np.float64)
        self.seen = 0

    def add(self, values: np.ndarray) -> None:
        room = MAX_KEPT - len(self.kept)
        if room > 0:
            self.kept = np.concatenate([self.kept, values[:room]])
            self.seen += min(room, len(values))
            values = values[room:]
        if len(values):  # reservoir sampling: the t-th value replaces a kept one with probability MAX_KEPT / t
            positions = self.seen + 1 + np.arange(len(values))
            chosen = _RANDOM.random(len(values)) * positions < MAX_KEPT
            self.kept[_RANDOM.integers(0, MAX_KEPT, int(chosen.sum()))] = values[chosen]
            self.seen += len(values)


def summary_family(name: str, text: str, labels: list[str], windows: Mapping[_Labels, WindowQuantiles],
                   quantiles: Sequence[tuple[float, float]] = DEFAULT_QUANTILES) -> SummaryMetricFamily:
    """A summary family: per label values, a ``quantile`` series per (quantile, error) pair, then
    ``_count`` and ``_sum``."""
    family = SummaryMetricFamily(name, text, labels=labels)
    wanted = [quantile for quantile, _ in quantiles]
    for label_values, window in windows.items():
        for quantile, value in zip(wanted, window.query(wanted), strict=True):
            family.add_sample(name, dict(zip(labels, label_values, strict=True)) | {"quantile": str(quantile)}, value)
        family.add_metric(list(label_values), window.count, window.sum)
    return family
