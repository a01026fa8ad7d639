"""Triton's ``--metrics-config <setting>=<value>`` settings: which latency families ``/metrics`` has.

Keys and defaults follow Triton's ``docs/user_guide/metrics.md`` ("Latencies") and its model
metric reporter: ``counter_latencies`` (default true: the cumulative ``*_duration_us`` counters),
``summary_latencies`` (default false: the ``*_summary_us`` summaries), ``summary_quantiles``
(``<quantile>:<error>,...``; default ``0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001``) and
``histogram_latencies`` (default false: ``nv_inference_first_response_histogram_ms``, added in
Triton releases after 2.51). ``summary_max_age`` (seconds, default 60) is this server's own: Triton
keeps the prometheus-cpp default of a 60 s window in 5 age buckets and has no key for it.
Each number of ``summary_quantiles`` is read as Triton's core reads it (``MetricReporterConfig::
ParseQuantiles``: C++ ``std::stod``), from its longest numeric prefix: ``0.1:0.0.1`` is the pair
(0.1, 0.0), kept as it is. Unlike Triton, which logs and skips what it cannot parse (a pair with no
``:`` or with no number), and ends on a number out of a double's range, a bad setting is a usage
error; so is a quantile outside [0, 1] or an error outside [0, 1], which Triton hands to
prometheus-cpp unchecked.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
_SWITCHES = ("counter_latencies", "summary_latencies", "histogram_latencies")
# what C++ strtod (so std::stod) reads of a string: leading white space, a sign, then a hexadecimal
# or decimal number, an infinity or a NaN (case-insensitive); the longest such prefix is taken
_STRTOD = re.compile(r"[ \t\n\v\f\r]*(?P<number>[+-]?(?:"
                     r"(?P<hex>0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?)"
                     r"|(?P<decimal>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)"
                     r"|inf(?:inity)?|nan(?:\([0-9a-z_]*\))?))", re.IGNORECASE)


@dataclass(frozen=True)
class MetricsConfig:
    """The parsed ``--metrics-config`` settings (Triton's defaults when none is given).

    Attributes:
        counter_latencies: export the cumulative ``nv_inference_*_duration_us`` counters.
        summary_latencies: export the ``nv_inference_*_summary_us`` summaries (microseconds).
        histogram_latencies: export ``nv_inference_first_response_histogram_ms``.
        summary_quantiles: (quantile, allowed error) pairs of the summaries, each in [0, 1].
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


def stod(text: str) -> float:
    """``text`` read as C++ ``std::stod`` reads it: the longest prefix that is a number (after leading
    white space), the rest ignored: ``"0.0.1"`` is 0.0, ``"0.5abc"`` 0.5, ``"0x1p-2"`` 0.25.

    Raises:
        ValueError: no number at the start (``std::invalid_argument``), or one that overflows or
            underflows a double (``std::out_of_range``: glibc's ``ERANGE``).
    """
    match = _STRTOD.match(text)
    if match is None:
        raise ValueError(f"no number in '{text}'")
    number, hexadecimal, decimal = match["number"], match["hex"], match["decimal"]
    sign = "-" if number[0] == "-" else ""
    if hexadecimal is not None:
        digits = hexadecimal[2:].lower()
        try:
            value = float.fromhex(sign + "0x" + digits + ("" if "p" in digits else "p0"))
        except OverflowError:
            raise ValueError(f"'{text}' is out of a double's range") from None
    elif decimal is None:  # an infinity, or a NaN (its "(chars)" payload dropped)
        return float(sign + ("nan" if number.lstrip("+-")[:3].lower() == "nan" else "inf"))
    else:
        value = float(number)
    if value in (math.inf, -math.inf) or (abs(value) < sys.float_info.min and _inexact(value, hexadecimal, decimal)):
        raise ValueError(f"'{text}' is out of a double's range")  # glibc's ERANGE: overflow, or tiny and inexact
    return value


def _inexact(value: float, hexadecimal: str | None, decimal: str | None) -> bool:
    """Whether ``value``, zero or subnormal, differs from the number the text wrote (its hexadecimal
    or decimal digits)."""
    if hexadecimal is not None:
        mantissa, _, exponent = hexadecimal[2:].lower().partition("p")
    else:
        mantissa, _, exponent = (decimal or "").lower().partition("e")
    if value == 0:
        return any(digit not in "0." for digit in mantissa)
    if hexadecimal is None:
        return Fraction(abs(value)) != Fraction(Decimal(decimal or "0"))
    whole, _, fraction = mantissa.partition(".")
    return Fraction(abs(value)) != Fraction(int(whole + fraction or "0", 16)) * Fraction(2) ** (
        int(exponent or "0") - 4 * len(fraction))


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    pairs = []
    for pair in value.split(","):
        quantile, colon, error = pair.partition(":")
        try:
            parsed = (stod(quantile), stod(error))
        except ValueError:
            parsed = None
        if not colon or parsed is None or not all(0 <= number <= 1 for number in parsed):
            raise ValueError(f"--metrics-config summary_quantiles: invalid pair '{pair}': expected "
                             "<quantile>:<error>, each a number from 0 to 1 (read as C++ std::stod reads it)")
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
