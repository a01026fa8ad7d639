"""``InferTensorContents`` from the wire: typed tensor data, packed or not, into numpy arrays.

Each repeated scalar field may arrive packed (one length-delimited run, what every current
encoder writes) or as one tagged value per element, in any mix and order; a field's values keep
their order on the wire. Packed runs are decoded by numpy (``wire.packed_varints``, ``frombuffer``
for fixed-width values), elements one by one. Varints narrow as protobuf narrows them: int32 and
uint32 keep the low 32 bits, bool is any non-zero value; float and double keep their bit patterns.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import numpy as np

from kserve_v2.codec.messages import CONTENTS_FIELDS, TensorContents
from kserve_v2.codec.wire import (
    FIXED32, FIXED64, LENGTH, VARINT, WireError, length, skip, tag, varint, varints,
    varints_at,
)

T = TypeVar("T")

_BYTES_FIELD = 8
_RUN = 8  # unpacked elements of one field in a row before the rest of the run is decoded in bulk
_RUN_WINDOW = 512
# one-byte tags of unpacked scalar elements -> their fixed width (0: a varint)
_ONE_BYTE = {**{field << 3 | VARINT: 0 for field in range(1, 6)}, 6 << 3 | FIXED32: 4, 7 << 3 | FIXED64: 8}


class _Fixed(NamedTuple):
    wire: int
    width: int
    wire_dtype: np.dtype
    native: np.dtype


_FIXED_WIDTH = {6: _Fixed(FIXED32, 4, np.dtype("<f4"), np.dtype(np.float32)),
               7: _Fixed(FIXED64, 8, np.dtype("<f8"), np.dtype(np.float64))}


def decode_contents(data: bytes, pos: int, end: int, depth: int, before: TensorContents | None) -> TensorContents:
    """The contents message in ``data[pos:end]``, appended to ``before`` (a field sent twice merges).

    ``depth``: the nesting of this message (for the groups of its unknown fields).

    Raises:
        WireError: malformed fields, a packed fixed-width run whose length is not a multiple of the
            width.
    """
    numbers: dict[int, list[np.ndarray | list[int]]] = {}  # varint fields: packed arrays and runs of elements
    fixed: dict[int, list[np.ndarray | list[bytes]]] = {}  # float and double: packed arrays and runs of elements
    strings: list[bytes] = []
    streak = 0  # unpacked elements in a row with the same one-byte tag
    previous = -1
    while pos < end:
        start = pos
        byte = data[pos]
        if byte != previous and byte in _ONE_BYTE:  # an element of another field than the last: no run to find
            previous, streak = byte, 1
            width = _ONE_BYTE[byte]
            stop = pos + 1 + (width or 1)
            if stop <= end and (width or data[pos + 1] < 0x80):
                runs = (fixed if width else numbers).setdefault(byte >> 3, [])
                value = data[pos + 1 : stop] if width else data[pos + 1]
                if runs and isinstance(runs[-1], list):
                    runs[-1].append(value)  # type: ignore[arg-type]  # a field's runs hold ints, or bytes
                else:
                    runs.append([value])  # type: ignore[list-item]
                pos = stop
                continue
        field, wire, pos = tag(data, pos, end)
        if wire == VARINT or wire == FIXED32 or wire == FIXED64:
            streak = streak + 1 if data[start] == previous and pos == start + 1 else 1
            previous = data[start]
            if streak >= _RUN and (field <= 5 or field in _FIXED_WIDTH):  # decode the rest of the run in bulk
                streak = 0
                found, after = _run(data, start, end, _FIXED_WIDTH.get(field))
                if after > start:
                    (numbers if field <= 5 else fixed).setdefault(field, []).append(found)
                    pos = after
                    continue
        if field <= 5:
            if wire == VARINT:
                value, pos = varint(data, pos, end)
                _element(numbers.setdefault(field, []), value)
                continue
            if wire == LENGTH:
                start, pos = length(data, pos, end)
                numbers.setdefault(field, []).append(varints(data, start, pos))
                continue
        elif field in _FIXED_WIDTH:
            kind = _FIXED_WIDTH[field]
            if wire == kind.wire:
                if pos + kind.width > end:
                    raise WireError("truncated fixed-width value")
                _element(fixed.setdefault(field, []), data[pos : pos + kind.width])
                pos += kind.width
                continue
            if wire == LENGTH:
                start, pos = length(data, pos, end)
                if (pos - start) % kind.width:
                    raise WireError("packed fixed-width values of a partial length")
                count = (pos - start) // kind.width
                fixed.setdefault(field, []).append(np.frombuffer(data, kind.wire_dtype, count, start))
                continue
        elif field == _BYTES_FIELD and wire == LENGTH:
            start, pos = length(data, pos, end)
            strings.append(data[start:pos])
            continue
        pos = skip(data, pos, end, field, wire, depth)
    fields = before.fields if before is not None else {}
    merged: dict[str, np.ndarray | list[bytes]] = {}
    for number, name in enumerate(CONTENTS_FIELDS, 1):
        values = fields.get(name)
        new: np.ndarray | list[bytes] | None = None
        if number == _BYTES_FIELD:
            new = strings or None
        elif number in numbers:
            new = _numbers(number, numbers[number])
        elif number in fixed:
            new = _floats(_FIXED_WIDTH[number], fixed[number])
        if new is not None:
            if isinstance(new, list):
                values = [*values, *new] if isinstance(values, list) else new
            else:
                values = new if not isinstance(values, np.ndarray) else np.concatenate([values, new])
        if values is not None and len(values):
            merged[name] = values
    return TensorContents(merged)


def _run(data: bytes, pos: int, end: int, kind: _Fixed | None) -> tuple[np.ndarray, int]:
    """Unpacked elements of one field in a row, from the one-byte tag at ``pos`` for as long as it
    repeats: (their values: varints as uint64, ``kind``'s fixed-width values in its wire dtype; the
    position after them). The windows read double from ``_RUN_WINDOW`` bytes while the run fills
    them, so a short run costs little."""
    tag_byte = data[pos]
    found: list[np.ndarray] = []
    window = _RUN_WINDOW
    while pos < end:
        raw = np.frombuffer(data, np.uint8, min(end, pos + window) - pos, pos)
        if kind is not None:
            stride = kind.width + 1
            count = raw.size // stride
            records = raw[: count * stride].reshape(count, stride)
            matches = records[:, 0] == tag_byte
            taken = count if matches.all() else int(matches.argmin())
            found.append(np.frombuffer(records[:taken, 1:].tobytes(), kind.wire_dtype))
            pos += taken * stride
            whole = taken == count
        else:
            ends = np.flatnonzero(raw < 0x80)
            pairs = ends.size // 2
            starts = np.empty_like(ends)
            starts[:1] = 0
            starts[1:] = ends[:-1] + 1
            tags, values = slice(0, 2 * pairs, 2), slice(1, 2 * pairs, 2)
            good = (starts[tags] == ends[tags]) & (raw[ends[tags]] == tag_byte) & (ends[values] - starts[values] < 10)
            taken = pairs if good.all() else int(good.argmin())
            found.append(varints_at(raw, starts[values][:taken], ends[values][:taken]))
            pos += int(ends[2 * taken - 1]) + 1 if taken else 0
            whole = taken == pairs
        if not whole or raw.size < window:  # the run ended, or the window reached the end
            break
        window *= 2
    return (np.concatenate(found) if len(found) > 1 else found[0]), pos


def _element(runs: list[np.ndarray | list[T]], value: T) -> None:
    """Append one unpacked element to its field's last run of elements (a new run after a packed one)."""
    last = runs[-1] if runs else None
    if isinstance(last, list):
        last.append(value)
    else:
        runs.append([value])


def _numbers(field: int, runs: list[np.ndarray | list[int]]) -> np.ndarray:
    """A varint field's values in its type, from its runs."""
    joined = np.concatenate([np.asarray(run, np.uint64) for run in runs])
    if field == 1:
        nonzero: np.ndarray = joined != 0
        return nonzero
    if field == 2:
        return joined.astype(np.uint32).view(np.int32)
    if field == 3:
        return joined.view(np.int64)
    if field == 4:
        return joined.astype(np.uint32)
    return joined


def _floats(kind: _Fixed, runs: list[np.ndarray | list[bytes]]) -> np.ndarray:
    """A float or double field's values (their bit patterns as sent), from its runs."""
    parts = [run if isinstance(run, np.ndarray) else np.frombuffer(b"".join(run), kind.wire_dtype) for run in runs]
    joined: np.ndarray = parts[0] if len(parts) == 1 else np.concatenate(parts)
    values: np.ndarray = joined.astype(kind.native, copy=False)
    return values
