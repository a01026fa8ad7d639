"""Triton's trace extension: the trace settings, global and per model, that pick the traced requests.

Semantics and texts follow Triton's ``docs/protocol/extension_trace.md`` and its HTTP handler:
``trace_level`` is ``["OFF"]`` or any of ``TIMESTAMPS`` / ``TENSORS``; ``trace_rate`` traces one
request in every N; ``trace_count`` is the number of traces still to take (-1: no limit);
``log_frequency`` is validated and, as in Triton's ``opentelemetry`` trace mode, has no effect
(spans are exported over OTLP, not written to a trace file); ``trace_file`` cannot be changed over
the network. A model's first update copies the global values it does not name; clearing one of its
settings (an empty value list, JSON ``null``) makes it follow the global value again; clearing a
global setting restores its startup value. Used on the event loop only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias
from dataclasses import dataclass, field

from kserve_v2.errors import InvalidInput, Unsupported

MODE = "opentelemetry"
LEVELS = ("TIMESTAMPS", "TENSORS")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
Value: TypeAlias = tuple[str, ...] | str  # trace_level's levels, or another setting's number as text
# Triton's defaults (level OFF, every 1000th request); with an OTLP endpoint every request is traced
_OFF_DEFAULTS: dict[str, Value] = {"trace_level": ("OFF",), "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0"}
_ON_DEFAULTS: dict[str, Value] = {**_OFF_DEFAULTS, "trace_level": ("TIMESTAMPS",), "trace_rate": "1"}
_SCALARS = ("trace_rate", "trace_count", "log_frequency")


@dataclass
class _Scope:
    """The settings one scope (global, or one model) set itself, and its sampling counters."""

    values: dict[str, Value] = field(default_factory=dict)
    seen: int = 0


class TraceSettings:
    """Global and per-model trace settings (see the module docstring).

    Args:
        exporting: whether spans have somewhere to go (an OTLP endpoint is configured); sets the
            startup values (every request traced) and is otherwise Triton's defaults (OFF).
        url: the OTLP endpoint, reported as the ``url`` setting of the opentelemetry mode.
    """

    def __init__(self, exporting: bool, url: str = "") -> None:
        self._defaults = dict(_ON_DEFAULTS if exporting else _OFF_DEFAULTS)
        self._global = _Scope(dict(self._defaults))
        self._models: dict[str, _Scope] = {}
        self._url = url

    def update(self, model: str, settings: Mapping[str, Sequence[str]]) -> None:
        """Apply new values (``model`` empty: the global settings); unknown names are ignored (Triton).

        Args:
            model: the model the settings are for, or "" for the global ones (the caller checks
                that the model exists).
            settings: setting name -> values; an empty sequence clears the setting.

        Raises:
            Unsupported: ``trace_file`` given -> UNIMPLEMENTED / 501.
            InvalidInput: a level, rate, count or frequency Triton would not parse -> INVALID_ARGUMENT / 400.
        """
        if "trace_file" in settings:
            raise Unsupported("trace file location can not be updated through network protocol")
        parsed = {name: (_parse(name, values) if values else None) for name, values in settings.items()
                  if name == "trace_level" or name in _SCALARS}
        scope = self._global if not model else self._models.get(model)
        if scope is None:  # a model's first update copies the global values it does not name
            scope = self._models[model] = _Scope(dict(self._global.values))
        for name, value in parsed.items():
            if value is not None:
                scope.values[name] = value
            elif model:
                scope.values.pop(name, None)
            else:
                scope.values[name] = self._defaults[name]

    def current(self, model: str) -> dict[str, Value]:
        """The settings in force for ``model`` ("" for the global ones), as Triton answers them:
        ``trace_level`` as a tuple, the others as strings."""
        values = {**self._global.values, **(self._models[model].values if model in self._models else {})}
        answer: dict[str, Value] = {name: values[name] for name in ("trace_level", "trace_rate",
                                                                                   "trace_count")}
        answer["trace_mode"] = MODE
        if self._url:
            answer["url"] = self._url
        return answer

    def sample(self, model: str) -> bool:
        """Whether to trace the next request of ``model``: level not OFF, one in ``trace_rate``
        requests, while ``trace_count`` is not exhausted (taking a trace counts it down)."""
        scope = self._models.get(model, self._global)
        values = {**self._global.values, **scope.values}
        count, rate = _number(values, "trace_count"), _number(values, "trace_rate")
        if values["trace_level"] == ("OFF",) or count == 0 or rate == 0:
            return False
        scope.seen += 1
        if scope.seen % rate:
            return False
        if count > 0:
            scope.values["trace_count"] = str(count - 1)
        return True


def _number(values: Mapping[str, Value], name: str) -> int:
    """A numeric setting (every setting but trace_level is one, kept as text as Triton answers it)."""
    value = values[name]
    assert isinstance(value, str), name
    return int(value)


def _parse(name: str, values: Sequence[str]) -> Value:
    if name == "trace_level":
        levels = tuple(values)
        if "OFF" in levels and len(levels) > 1:
            raise InvalidInput("Expect only one trace level 'OFF' is specified")
        unknown = [level for level in levels if level != "OFF" and level not in LEVELS]
        if unknown:
            raise InvalidInput(f"Unknown trace level '{unknown[0]}': expected OFF, TIMESTAMPS or TENSORS")
        return tuple(level for level in ("OFF", *LEVELS) if level in levels)
    if len(values) != 1:
        raise InvalidInput(f"Expect only one value for '{name}', got {len(values)}")
    low, high = (-1, _INT32_MAX) if name == "trace_count" else (0, _UINT32_MAX)
    text = values[0]
    try:
        number = int(text)
    except ValueError:
        raise InvalidInput(f"Unable to parse '{name}', got: {text}") from None
    if name == "trace_count" and number < low:
        raise InvalidInput(f"Unable to parse 'trace_count'. Expecting value >= {low}, got:{text}")
    if not low <= number <= high:
        raise InvalidInput(f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}")
    return str(number)
