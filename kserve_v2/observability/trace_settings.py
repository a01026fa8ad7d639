"""Triton's trace extension: the trace settings, global and per model, that pick the traced requests,
and where Triton's trace mode gathers and writes their traces.

Semantics and texts follow Triton's ``docs/protocol/extension_trace.md``, its HTTP handler and its
trace manager (``src/tracer.cc``): ``trace_level`` is ``["OFF"]`` or any of ``TIMESTAMPS`` /
``TENSORS``; ``trace_rate`` traces one request in every N; ``trace_count`` is the number of traces
still to take (-1: no limit); ``log_frequency`` is how many traces go to each numbered trace file
(0: all to the trace file); ``trace_file`` cannot be changed over the network. The global
settings start from ``--trace-config``; clearing one (JSON ``null``) restores its startup value.
A model's settings hold what was set for that model; everything else follows the global settings,
also when those change later; clearing every setting of a model makes it use the global settings
again. Each update starts the settings afresh (their request and trace counters), as Triton
replaces its setting object, and writes out what they had gathered. In ``opentelemetry`` mode
``log_frequency`` is checked and has no effect. Used on the event loop only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from kserve_v2.observability.trace_file import Entry, TraceFile
from kserve_v2.protocol.errors import InvalidInput, Unsupported
from kserve_v2.settings.trace_config import LEVELS, OFF, TRITON, TraceConfig

_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
Value: TypeAlias = tuple[str, ...] | int  # trace_level's levels, or another setting's number
NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass
class Setting:
    """The settings in force for one scope (the global settings, or a model's), with their counters
    and the traces gathered under them that are not written yet.

    Attributes:
        values: setting name (``NAMES``) -> value; ``trace_count`` counts down as traces are taken.
        specified: the names the scope set itself (for the global scope: over the startup values).
    """

    values: dict[str, Value]
    specified: frozenset[str] = frozenset()
    sampled: int = 0  # requests seen, for the rate
    collected: int = 0  # traces finished
    pending: list[list[Entry]] = field(default_factory=list)
    retired: bool = False  # replaced by an update: what it still gathers is written at once

    def number(self, name: str) -> int:
        value = self.values[name]
        assert isinstance(value, int), name
        return value

    @property
    def tensors(self) -> bool:
        """Whether the TENSORS level is on."""
        level = self.values["trace_level"]
        return isinstance(level, tuple) and "TENSORS" in level


class TraceSettings:
    """Global and per-model trace settings (see the module docstring).

    Args:
        config: the mode and startup settings (``--trace-config``).
        output: Triton's trace file, or None (opentelemetry mode, or triton mode without a file:
            then nothing is traced, as in Triton).
    """

    def __init__(self, config: TraceConfig, output: TraceFile | None = None) -> None:
        self._config = config
        self._output = output
        self._startup = Setting({"trace_level": config.level, "trace_rate": config.rate, "trace_count": config.count,
                                 "log_frequency": config.log_frequency})
        self._global = Setting(dict(self._startup.values))
        self._models: dict[str, Setting] = {}

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
        new = {name: (_parse(name, values) if values else None) for name, values in settings.items() if name in NAMES}
        self._replace(model, new)
        if not model:  # the models' settings follow the global ones where they set nothing themselves
            for name in list(self._models):
                self._replace(name, {})

    def _replace(self, model: str, new: Mapping[str, Value | None]) -> None:
        current = self._models.get(model) if model else self._global
        fallback = self._global if model else self._startup
        values: dict[str, Value] = {}
        specified = set()
        for name in NAMES:
            given = new.get(name)
            if given is not None:
                values[name] = given
            elif name not in new and current is not None and name in current.specified:
                values[name] = current.values[name]  # set before, kept (a count as far as it has counted down)
            else:  # never set, or cleared
                values[name] = fallback.values[name]
                continue
            specified.add(name)
        if current is not None:
            self._retire(current)
        if not model:
            self._global = Setting(values, frozenset(specified))
        elif specified:
            self._models[model] = Setting(values, frozenset(specified))
        else:
            self._models.pop(model, None)

    def current(self, model: str) -> dict[str, tuple[str, ...] | str]:
        """The settings in force for ``model`` ("" for the global ones), as Triton answers them:
        ``trace_level`` as a tuple, the others as strings; in triton mode with ``log_frequency``
        and ``trace_file``; then ``trace_mode`` (and ``url`` in opentelemetry mode)."""
        values = self._models.get(model, self._global).values
        answer: dict[str, tuple[str, ...] | str] = {
            name: value if isinstance(value, tuple) else str(value) for name, value in values.items()}
        if self._config.mode == TRITON:
            answer["trace_file"] = self._config.file
        else:
            del answer["log_frequency"]
        answer["trace_mode"] = self._config.mode
        if self._config.url:
            answer["url"] = self._config.url
        return answer

    def sample(self, model: str) -> Setting | None:
        """Whether to trace the next request of ``model``: level not OFF, one in ``trace_rate``
        requests, while ``trace_count`` is not exhausted (taking a trace counts it down), and in
        triton mode only with a trace file. Returns the settings the trace is gathered under."""
        setting = self._models.get(model, self._global)
        count, rate = setting.number("trace_count"), setting.number("trace_rate")
        if setting.values["trace_level"] == OFF or count == 0 or rate == 0:
            return None
        if self._config.mode == TRITON and self._output is None:
            return None
        setting.sampled += 1
        if setting.sampled % rate:
            return None
        if count > 0:
            setting.values["trace_count"] = count - 1
        return setting

    def collect(self, setting: Setting, trace: list[Entry]) -> None:
        """A trace taken under ``setting`` has finished (triton mode): write it, or keep it until a
        group is complete. As Triton: a group of ``log_frequency`` traces, or the traces of a
        ``trace_count`` once it is exhausted, goes to the next numbered file. Otherwise (this
        server's choice: Triton keeps them until exit) an unlimited count writes each trace to the
        trace file at once, and a limited one keeps its traces (at most the count) until its
        settings change or the server exits."""
        if self._output is None:
            return
        setting.pending.append(trace)
        setting.collected += 1
        frequency, count = setting.number("log_frequency"), setting.number("trace_count")
        if setting.retired or (frequency == 0 and count == -1):
            self._write(setting)
        elif (count == 0 and setting.collected == setting.sampled) or (frequency and len(setting.pending) >= frequency):
            self._output.write_numbered(setting.pending)
            setting.pending.clear()

    def close(self) -> None:
        """Write every trace still kept (server exit)."""
        for setting in (self._global, *self._models.values()):
            self._retire(setting)

    def _retire(self, setting: Setting) -> None:
        setting.retired = True
        self._write(setting)

    def _write(self, setting: Setting) -> None:
        """Write a setting's kept traces: to a numbered file with a ``log_frequency``, else to the trace file."""
        if self._output is None or not setting.pending:
            return
        if setting.number("log_frequency"):
            self._output.write_numbered(setting.pending)
        else:
            self._output.append(setting.pending)
        setting.pending.clear()


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
    return number
