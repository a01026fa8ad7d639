"""Triton's ``--trace-config [<mode>,]<setting>=<value>`` flag: the trace mode and the startup trace settings.

Format, settings and defaults follow Triton's ``docs/user_guide/trace.md`` and its command-line
parser: global settings ``level`` (``OFF``, ``TIMESTAMPS``, ``TENSORS``; repeat to combine; ``OFF``
given anywhere wins), ``rate`` (trace one request in N; default 1000), ``count`` (traces to take,
-1 = no limit) and ``mode`` (``triton``, the default, or ``opentelemetry``); ``triton,file=<path>``
and ``triton,log-frequency=<N>`` for Triton's JSON trace file; ``opentelemetry,url=<endpoint>``,
``opentelemetry,resource=<key>=<value>`` and the batch span processor's ``bsp_max_queue_size``,
``bsp_schedule_delay`` (ms) and ``bsp_max_export_batch_size`` for OpenTelemetry.

As in Triton, the ``opentelemetry,...`` settings count only in the ``opentelemetry`` mode. This
server's own ``--trace-otlp-endpoint`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is the ``url``
when ``opentelemetry,url`` is not given, picks the ``opentelemetry`` mode when no ``mode`` is given,
and then traces every request from the start (level TIMESTAMPS, rate 1) unless ``level`` or
``rate`` say otherwise. Unlike Triton, which skips
settings it does not know, an unknown setting is a usage error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TRITON = "triton"
OPENTELEMETRY = "opentelemetry"
LEVELS = ("TIMESTAMPS", "TENSORS")
OFF = ("OFF",)
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"  # Triton's default for opentelemetry,url
BSP_SETTINGS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
# Triton's spellings of a level on the command line (ParseTraceLevelOption)
_LEVEL_WORDS = {"off": "OFF", "false": "OFF", "true": "TIMESTAMPS", "on": "TIMESTAMPS", "min": "TIMESTAMPS",
                "max": "TIMESTAMPS", "timestamps": "TIMESTAMPS", "tensors": "TENSORS"}


@dataclass(frozen=True)
class TraceConfig:
    """The trace mode and the settings the server starts with (Triton's defaults when none is given).

    Attributes:
        mode: ``triton`` (JSON trace file) or ``opentelemetry`` (spans over OTLP/HTTP).
        level: ``("OFF",)``, or the levels traced, in ``LEVELS`` order.
        rate: one request in ``rate`` is traced (0: none).
        count: traces still to take (-1: no limit).
        file: the Triton trace file ("" in triton mode: nothing is traced, as in Triton).
        log_frequency: traces per numbered file ``<file>.<n>`` (0: all in ``<file>``).
        url: the OTLP/HTTP traces endpoint (opentelemetry mode).
        resource: OpenTelemetry resource attributes, (key, value) pairs.
        bsp: batch span processor settings given, (``BSP_SETTINGS`` name, value) pairs.
    """

    mode: str = TRITON
    level: tuple[str, ...] = OFF
    rate: int = 1000
    count: int = -1
    file: str = ""
    log_frequency: int = 0
    url: str = ""
    resource: tuple[tuple[str, str], ...] = ()
    bsp: tuple[tuple[str, int], ...] = ()


def parse_trace_config(entries: Sequence[str], otlp_endpoint: str = "") -> TraceConfig:
    """Parse ``--trace-config`` values in order (a later value of a setting wins).

    Args:
        entries: the flag's values, ``<setting>=<value>`` or ``<mode>,<setting>=<value>``.
        otlp_endpoint: ``--trace-otlp-endpoint`` ("" when not given).

    Raises:
        ValueError: a malformed entry, an unknown mode or setting, or a value that does not parse,
            with Triton's texts where it has one.
    """
    given: dict[tuple[str, str], str] = {}
    levels: list[str] = []
    resource: list[tuple[str, str]] = []
    for text in entries:
        scope, setting, value = _split(text)
        if scope == "" and setting == "level":
            levels.append(_level(value))
        elif scope == OPENTELEMETRY and setting == "resource":
            key, equals, attribute = value.partition("=")
            if not equals or not key:
                raise ValueError(f"--trace-config opentelemetry,resource expects <key>=<value>, got '{value}'")
            resource.append((key, attribute))
        elif (scope, setting) in _KNOWN:
            given[(scope, "log-frequency" if setting == "log_frequency" else setting)] = value
        else:
            raise ValueError(f"unknown --trace-config setting '{setting}'" + (f" for mode '{scope}'" if scope else ""))
    mode = _mode(given[("", "mode")]) if ("", "mode") in given else OPENTELEMETRY if otlp_endpoint else TRITON
    eager = mode == OPENTELEMETRY and bool(otlp_endpoint)  # --trace-otlp-endpoint: every request from the start
    level = OFF if not levels and not eager else ("TIMESTAMPS",) if not levels else (
        OFF if "OFF" in levels else tuple(name for name in LEVELS if name in levels))
    rate = _number("rate", given.get(("", "rate"), "1" if eager else "1000"), 0, _UINT32_MAX)
    url = given.get((OPENTELEMETRY, "url")) or otlp_endpoint or DEFAULT_OTLP_URL
    if "://" not in url:
        url = "http://" + url  # Triton takes host:port/path
    return TraceConfig(mode, level, rate, _number("count", given.get(("", "count"), "-1"), -1, _INT32_MAX),
                       given.get((TRITON, "file"), ""),
                       _number("log-frequency", given.get((TRITON, "log-frequency"), "0"), 0, _UINT32_MAX),
                       url if mode == OPENTELEMETRY else "", tuple(resource),
                       tuple((name, _number(name, given[(OPENTELEMETRY, name)], 0, _UINT32_MAX))
                             for name in BSP_SETTINGS if (OPENTELEMETRY, name) in given))


_KNOWN = {("", "rate"), ("", "count"), ("", "mode"), (TRITON, "file"), (TRITON, "log-frequency"),
          (TRITON, "log_frequency"), (OPENTELEMETRY, "url"), *((OPENTELEMETRY, name) for name in BSP_SETTINGS)}


def _split(text: str) -> tuple[str, str, str]:
    """(mode or "", setting, value) of one entry (Triton's ParseTraceConfigOption)."""
    equals = text.find("=")
    comma = text.find(",", 0, equals if equals >= 0 else len(text))
    scope = text[:comma] if comma > 0 else ""
    if comma == 0:
        raise ValueError(f"No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
                         f"or <setting>=<value>. Got {text}")
    setting, value = text[comma + 1:equals], text[equals + 1:]
    if equals < 0 or not setting or not value:
        raise ValueError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {text}")
    return (_mode(scope) if scope else ""), setting, value


def _mode(text: str) -> str:
    if text.lower() in (TRITON, OPENTELEMETRY):
        return text.lower()
    raise ValueError(f"invalid value for trace mode option: {text}. Available options are \"triton\" and \"opentelemetry\"")


def _level(text: str) -> str:
    level = _LEVEL_WORDS.get(text.lower())
    if level is None:
        raise ValueError(f"invalid value for trace level option: {text}")
    return level


def _number(name: str, text: str, low: int, high: int) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"Bad option: \"--trace-config {name}\": '{text}' is not an integer") from None
    if not low <= number <= high:
        raise ValueError(f"Bad option: \"--trace-config {name}\": {number} is out of range [{low}, {high}]")
    return number
