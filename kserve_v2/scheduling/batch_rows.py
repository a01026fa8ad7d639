"""Tensor rows along the batch dim, the arithmetic every batcher of tensor models shares: the batch
key of a request (``row_key``, ``key_parameters``), its rows merged with others' (``merge_rows``), a batch's outputs cut
back into the members' shares (``split_rows``). ``dynamic_batcher.RowBatching`` runs batches with
them; the sequence batcher keys its rows with ``row_key``; ragged batching splits its plain outputs
with ``split_rows``.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from kserve_v2.backend import Execution, Parameter
from kserve_v2.protocol.errors import InternalError
from kserve_v2.protocol.reserved import RESERVED_PARAMETERS
from kserve_v2.scheduling.base import Feeds


def key_parameters(parameters: Mapping[str, Parameter]) -> tuple[tuple[str, str], ...]:
    """The parameters that tell batches apart: all but Triton's reserved ones
    (``protocol.reserved.RESERVED_PARAMETERS``: requests differing in priority or timeout still batch
    together), sorted, as text."""
    return tuple(sorted((k, str(v)) for k, v in parameters.items() if k not in RESERVED_PARAMETERS))


def row_key(feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter]) -> Hashable:
    """Tensor models batch requests with the same outputs, parameters (``key_parameters``) and
    non-batch input shapes and datatypes."""
    return (tuple(output_names), key_parameters(parameters),
            tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(feeds.items())))


def merge_rows(members: list[Feeds]) -> Feeds:
    """The members' inputs concatenated along the batch dim."""
    if len(members) == 1:
        return members[0]
    return {name: np.concatenate([m[name] for m in members]) for name in members[0]}


def split_rows(execution: Execution, sizes: list[int]) -> list[Execution]:
    """A batch's execution cut along the batch dim into the members' shares (the first counts
    the execution and the tokens).

    Raises:
        InternalError: an output without the batch's rows.
    """
    if len(sizes) == 1:
        return [execution]
    total, bounds = sum(sizes), list(itertools.accumulate(sizes))[:-1]
    for array in execution.outputs:
        if array.ndim == 0 or array.shape[0] != total:
            raise InternalError(f"the model returned an output of shape {list(array.shape)} for a batch of {total}")
    per_output = [np.split(array, bounds) for array in execution.outputs]
    return [Execution(list(parts), execution.pre_ns, execution.post_ns, execution.tokens if i == 0 else 0, int(i == 0))
            for i, parts in enumerate(zip(*per_output, strict=True))]
