"""Triton's JSON trace file (``--trace-config triton,file=<path>``), written with the standard library.

The shape is Triton's ``docs/user_guide/trace.md`` ("JSON Trace Output"): one JSON array of
entries; per traced request ``{"id", "model_name", "model_version"[, "request_id"][, "parent_id"]}``,
then one ``{"id", "timestamps": [{"name", "ns"}]}`` per timestamp and, at level TENSORS, one
``{"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}`` per tensor. Traces go to
``<path>``, or in groups (``log_frequency``, an exhausted ``trace_count``) to the numbered files
``<path>.0``, ``<path>.1``, ... each holding one whole array. Unlike Triton, which closes the
array of ``<path>`` only at exit, every write leaves ``<path>`` a complete JSON array: traces are
inserted before its closing bracket. The file is started afresh by the server's first write.
Used on the event loop; a write is one small buffered append.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
Entry = dict[str, Any]  # one element of the trace file's array


class TraceFile:
    """Where the traces of Triton's trace mode are written.

    Args:
        path: the trace file; the numbered files take its name plus ``.<n>``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._started = False  # whether this server has written ``path`` yet
        self._next_index = 0

    def append(self, traces: Sequence[Sequence[Entry]]) -> None:
        """Add traces (each a list of entries) to the end of ``path``'s array."""
        body = _entries(traces)
        if not body:
            return
        try:
            if not self._started:
                self.path.write_text(f"[{body}]")
                self._started = True
                return
            with open(self.path, "r+b") as out:
                out.seek(-1, 2)  # onto the closing bracket
                out.write(f",{body}]".encode())
        except OSError as err:
            log.error("failed writing trace file '%s': %s", self.path, err)

    def write_numbered(self, traces: Sequence[Sequence[Entry]]) -> None:
        """Write traces as the next numbered file ``<path>.<n>``, one whole array."""
        target = self.path.with_name(f"{self.path.name}.{self._next_index}")
        self._next_index += 1
        try:
            target.write_text(f"[{_entries(traces)}]")
        except OSError as err:
            log.error("failed writing trace file '%s': %s", target, err)


def _entries(traces: Sequence[Sequence[Entry]]) -> str:
    return ",".join(json.dumps(entry, separators=(",", ":")) for trace in traces for entry in trace)


def tensor_entry(trace_id: int, activity: str, name: str, datatype: str, array: np.ndarray) -> Entry:
    """One TENSORS entry: the data as comma-separated values (Triton writes BYTES elements in
    double quotes and leaves FP16 and BF16 data empty), the shape as comma-separated dims."""
    flat = array.reshape(-1)
    if datatype in ("FP16", "BF16"):
        data = ""
    elif datatype == "BYTES":
        data = ",".join(f'"{_text(value)}"' for value in flat.tolist())
    elif datatype == "BOOL":
        data = ",".join("1" if value else "0" for value in flat.tolist())
    elif flat.dtype.kind == "f":
        data = ",".join(format(value, "g") for value in flat.tolist())
    else:
        data = ",".join(map(str, flat.tolist()))
    return {"id": trace_id, "activity": activity,
            "tensor": {"name": name, "data": data, "shape": ",".join(map(str, array.shape)), "dtype": datatype}}


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
