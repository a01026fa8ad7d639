"""Triton's ``--metrics-config <setting>=<value>`` settings: which latency families ``/metrics`` has.

Keys and defaults follow Triton's ``docs/user_guide/metrics.md`` ("Latencies") and its model
metric reporter: ``counter_latencies`` (default true: the cumulative ``*_duration_us`` counters),
``summary_latencies`` (default false: the ``*_summary_us`` summaries), ``summary_quantiles``
(``<quantile>:<error>,...``; default ``0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001``) and
``histogram_latencies`` (default false: ``nv_inference_first_response_histogram_ms``, added in
Triton releases after 2.51). ``summary_max_age`` (seconds, default 60) is this server's own: Triton
keeps the prometheus-cpp default of a 60 s window in 5 age buckets and has no key for it.
Unlike Triton, which logs and skips what it cannot parse, a bad setting is a usage error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
_SWITCHES = ("counter_latencies", "summary_latencies", "histogram_latencies")


@dataclass(frozen=True)
class MetricsConfig:
    """The parsed ``--metrics-config`` settings (Triton's defaults when none is given).

    Attributes:
        counter_latencies: export the cumulative ``nv_inference_*_duration_us`` counters.
        summary_latencies: export the ``nv_inference_*_summary_us`` summaries (microseconds).
        histogram_latencies: export ``nv_inference_first_response_histogram_ms``.
        summary_quantiles: (quantile, allowed error) pairs of the summaries, each in (0, 1).
        summary_max_age_secs: the summaries' sliding window, in seconds (5 age buckets).
    """

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    summary_max_age_secs: float = 60.0


def parse_metrics_config(settings: Sequence[str]) -> MetricsConfig:
    """Parse ``--metrics-config`` values (``<setting>=<value>``, repeated); later ones win.

    Raises:
        ValueError: a value without ``=``, a setting name with a ``,`` (Triton has no per-name
            metrics settings), an unknown setting, or a value that does not parse.
    """
    switches = {name: getattr(MetricsConfig, name) for name in _SWITCHES}
    quantiles, max_age = DEFAULT_QUANTILES, MetricsConfig.summary_max_age_secs
    for text in settings:
        name, equals, value = text.partition("=")
        if not equals or not name or not value or "," in name:
            raise ValueError(f"--metrics-config option format is <setting>=<value>. Got {text}")
        if name in switches:
            switches[name] = _switch(name, value)
        elif name == "summary_quantiles":
            quantiles = _quantiles(value)
        elif name == "summary_max_age":
            max_age = _positive(name, value)
        else:
            known = ", ".join((*_SWITCHES, "summary_quantiles", "summary_max_age"))
            raise ValueError(f"unknown --metrics-config setting '{name}' (known: {known})")
    return MetricsConfig(switches["counter_latencies"], switches["summary_latencies"], switches["histogram_latencies"],
                         quantiles, max_age)


def _switch(name: str, value: str) -> bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"--metrics-config {name} must be true or false, got '{value}'")


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    pairs = []
    for pair in value.split(","):
        quantile, colon, error = pair.partition(":")
        try:
            parsed = (float(quantile), float(error))
        except ValueError:
            parsed = None
        if not colon or parsed is None or not all(0 < number < 1 for number in parsed):
            raise ValueError(f"--metrics-config summary_quantiles: invalid pair '{pair}': expected "
                             "<quantile>:<error> with both strictly between 0 and 1")
        pairs.append(parsed)
    return tuple(pairs)


def _positive(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:
        raise ValueError(f"--metrics-config {name} must be a number of seconds > 0, got '{value}'")
    return number
