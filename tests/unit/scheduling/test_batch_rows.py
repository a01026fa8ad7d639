"""Tensor rows along the batch dim (kserve_v2.scheduling.batch_rows): the batch key, merging the members' rows and
splitting a batch's outputs back."""

from __future__ import annotations

import numpy as np
import pytest

from kserve_v2.backend import Execution
from kserve_v2.protocol.errors import InternalError
from kserve_v2.scheduling.batch_rows import key_parameters, merge_rows, row_key, split_rows

Feeds = dict[str, np.ndarray]


def rows(n: int, width: int = 2, dtype: str = "<f4") -> Feeds:
    return {"INPUT0": np.arange(n * width, dtype=dtype).reshape(n, width)}


def test_row_key_ignores_the_batch_dim_only() -> None:
    assert row_key(rows(1), ["OUTPUT0"], {}) == row_key(rows(5), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {}) != row_key(rows(1, width=3), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {}) != row_key(rows(1, dtype="<i4"), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {}) != row_key(rows(1), ["OUTPUT1"], {})
    assert row_key(rows(1), [], {"a": 1}) != row_key(rows(1), [], {"a": 2})


def test_merge_then_split_gives_each_member_its_rows() -> None:
    members = [rows(1), rows(3), rows(2)]
    merged = merge_rows(members)
    assert merged["INPUT0"].shape == (6, 2)
    shares = split_rows(Execution([merged["INPUT0"] * 2], pre_ns=5, tokens=9), [1, 3, 2])
    assert [s.outputs[0].shape[0] for s in shares] == [1, 3, 2]
    assert np.array_equal(shares[1].outputs[0], members[1]["INPUT0"] * 2)
    # the batch's tokens and its one execution are counted once, on the first member
    assert [(s.tokens, s.executions) for s in shares] == [(9, 1), (0, 0), (0, 0)]
    assert merge_rows([members[0]]) is members[0]


def test_split_refuses_an_output_without_the_batch_rows() -> None:
    with pytest.raises(InternalError, match=r"shape \[4\] for a batch of 3"):
        split_rows(Execution([np.zeros(4)]), [1, 2])


def test_reserved_parameters_stay_out_of_the_key() -> None:
    reserved = {"sequence_id": 7, "sequence_start": True, "sequence_end": False, "priority": 1, "timeout": 9,
                "headers": "h", "binary_data_output": True}
    assert key_parameters({**reserved, "mine": 1}) == (("mine", "1"),)
    assert row_key(rows(1), ["OUTPUT0"], reserved) == row_key(rows(2), ["OUTPUT0"], {})
    assert row_key(rows(1), ["OUTPUT0"], {"mine": 1}) != row_key(rows(1), ["OUTPUT0"], {})
