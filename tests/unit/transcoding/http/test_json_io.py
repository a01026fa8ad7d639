"""The semantic routes' JSON writer (transcoding.http.json_io.json_text): float32 values written in their
own shortest form and read back unchanged, non-finite values as the standard library writes them."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from transcoding.http.json_io import json_text

FINITE_F32 = hnp.arrays(np.float32, st.integers(0, 64), elements=st.floats(width=32, allow_nan=False,
                                                                        allow_infinity=False))


@settings(max_examples=300, deadline=None)
@given(FINITE_F32)
def test_float32_vectors_read_back_as_the_same_float32(vector: np.ndarray) -> None:
    text = json_text({"embedding": vector})
    back = np.array(json.loads(text)["embedding"], dtype=np.float64).astype(np.float32)
    assert back.tobytes() == vector.tobytes()  # bit for bit, signed zeros and subnormals included


def test_float32_is_written_shorter_than_its_float64_widening() -> None:
    assert json_text([np.float32(0.1), np.array([0.1, -2.5e-8], np.float32)]) == b"[0.1,[0.1,-2.5e-8]]"
    vectors = np.random.default_rng(0).standard_normal((32, 384)).astype(np.float32)
    rows = [{"embedding": row} for row in vectors]
    assert len(json_text(rows)) < 0.7 * len(json.dumps([{"embedding": r.tolist()} for r in vectors]))


def test_strided_rows_are_written_like_contiguous_ones() -> None:
    matrix = np.array([[0.1, 7.0], [0.2, 8.0]], np.float32)
    assert json_text({"a": matrix[:, 0]}) == json_text({"a": np.ascontiguousarray(matrix[:, 0])}) == b'{"a":[0.1,0.2]}'


def test_non_finite_values_are_written_as_the_standard_library_writes_them() -> None:
    assert json_text({"v": np.array([0.5, np.nan, -np.inf], np.float32), "d": None}) == \
        b'{"v":[0.5,NaN,-Infinity],"d":null}'
    assert json_text({"v": np.array([1.0, np.inf], np.float32)[1::2]}) == b'{"v":[Infinity]}'
    assert json_text([np.float64("nan")]) == b"[NaN]"
    assert json_text({"d": None, "v": np.array([1.5], np.float32)}) == b'{"d":null,"v":[1.5]}'  # null alone


def test_other_numpy_values() -> None:
    assert json_text({"i": np.array([1, -2], np.int64), "b": np.array([True]), "s": np.int32(3),
                      "t": np.array(["x"]), "f": np.float64(0.1)}) == b'{"i":[1,-2],"b":[true],"s":3,"t":["x"],"f":0.1}'
