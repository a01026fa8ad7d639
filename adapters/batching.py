"""Text batching: the texts of several requests tokenized and run as one batch, split back per request.

A text model's inputs are ``max_batch_size: 0`` BYTES lists, so the core's tensor batching (rows
along dim 0) does not apply; under ``dynamic_batching`` its requests merge here instead
(``kserve_v2.backend.BatchStrategy``): requests that ask the same outputs with the same
parameters and non-text inputs share one pre-process, execute and post-process pass, padded to the
batch's longest text.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol

import numpy as np

from adapters.inputs import string_parameter
from adapters.tokenizer import OVERFLOW_POLICIES, Batch, TextTokenizer
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter, RequestContext, TextContract
from kserve_v2.protocol.errors import InvalidInput, ServerError
from kserve_v2.scheduling.batch_rows import key_parameters

# texts in one merged batch, unless preferred_batch_size says otherwise
TEXT_BATCH_ITEMS = 64


class Tokenized(Protocol):
    """A pre-processed request: its tokenized batch (``adapters.base.Prepared``)."""

    @property
    def batch(self) -> Batch: ...


class TextSteps(Protocol):
    """What text batching asks of its model (``adapters.base.TextAdapter`` provides it): its
    contract, its tokenizer, reading a request's texts, and its three steps run on merged feeds."""

    @property
    def text(self) -> TextContract: ...

    @property
    def tokenizer(self) -> TextTokenizer: ...

    def item_texts(self, feeds: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]) -> list[str]:
        """The request's ``text`` items (see ``TextAdapter.item_texts``)."""
        ...

    def check(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter]) -> None:
        """Raise what ``run_steps`` would raise before running the model (see ``TextAdapter.check``)."""
        ...

    def run_steps(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter]
                  ) -> tuple[dict[str, np.ndarray], Tokenized, int, int]:
        """Pre-process, execute, post-process: (outputs, the pre-processed request, pre_ns, post_ns)."""
        ...


class TextBatching:
    """The ``BatchStrategy`` of a text adapter.

    Args:
        adapter: the model whose steps run the merged batch.
    """

    inline = False

    def __init__(self, adapter: TextSteps) -> None:
        self._adapter = adapter

    def limit(self, config: mc.ModelConfig) -> int:
        """Texts in one merged batch: the largest ``preferred_batch_size``, else 64."""
        return max(config.dynamic_batching.preferred_batch_size, default=TEXT_BATCH_ITEMS)

    def items(self, feeds: dict[str, np.ndarray], batch_size: int) -> int:
        """The request's texts."""
        return len(feeds["text"])

    def key(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
            parameters: Mapping[str, Parameter]) -> Hashable:
        """Requests merge when they ask the same outputs with the same parameters and non-text inputs."""
        others = tuple((name, tuple(bytes(v) for v in array.reshape(-1))) for name, array in sorted(feeds.items())
                       if name != "text")
        return tuple(output_names), key_parameters(parameters), others

    def execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                      parameters: Mapping[str, Parameter], contexts: Sequence[RequestContext] = ()
                      ) -> list[Execution | Exception]:
        """Tokenize every member's texts as one batch (padded to its longest), run once, split back.

        Each member's texts, and its lengths under the ``error`` overflow policy, are checked
        first, so a bad request fails alone; a batch of one request runs as it is, its checks
        being the run's own.
        """
        started = time.perf_counter_ns()
        try:
            policy = string_parameter(parameters, "overflow_policy", "default")
            if policy not in OVERFLOW_POLICIES:
                raise InvalidInput(f"unknown overflow_policy '{policy}': use one of {list(OVERFLOW_POLICIES)}")
        except ServerError as err:
            return [err] * len(members)
        ragged = self._ragged()
        wanted = set(output_names) | {ragged[n] for n in output_names if n in ragged}
        alone = len(members) == 1  # its own checks are the run's: no need to tokenize it twice
        shares: list[Execution | Exception | None] = (
            [None] if alone else [self._refusal(m, wanted, parameters, policy) for m in members])
        valid = [index for index, share in enumerate(shares) if share is None]
        if valid:
            merged = {**members[valid[0]], "text": np.concatenate([members[i]["text"] for i in valid])}
            checked = {**parameters, "overflow_policy": "truncate_text"} if policy == "error" and not alone else parameters
            checks_ns = time.perf_counter_ns() - started  # the members' checks count as pre-processing
            try:
                computed, prepared, pre_ns, post_ns = self._adapter.run_steps(merged, wanted, checked)
            except ServerError as err:
                if not alone:
                    raise
                return [err]
            counts = [len(members[i]["text"]) for i in valid]
            bounds = np.concatenate([[0], np.cumsum(counts)])
            item_tokens = prepared.batch.feeds["attention_mask"].sum(axis=1)
            own = [int(item_tokens[bounds[i]:bounds[i + 1]].sum()) for i in range(len(counts))]
            own[0] += prepared.batch.tokens - sum(own)  # a shared query's tokens
            for position, (index, outputs) in enumerate(zip(valid, split_outputs(computed, output_names, counts, ragged),
                                                            strict=True)):
                shares[index] = Execution(outputs, pre_ns + checks_ns, post_ns, own[position], int(position == 0))
        return [share for share in shares if share is not None]

    def _refusal(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter],
                 policy: str) -> ServerError | None:
        """A member's own error (bad texts, or one over the token limit under the ``error`` policy,
        counted as the model sees it: with its prefixes and as pairs), else None."""
        try:
            if policy == "error":
                self._adapter.check(feeds, wanted, parameters)
            else:
                self._adapter.item_texts(feeds, parameters)
        except ServerError as err:
            return err
        return None

    def _ragged(self) -> dict[str, str]:
        """Outputs whose rows vary per item -> the output giving each item's rows (from the contract)."""
        return {name: output.lengths for output in self._adapter.text.outputs if output.lengths is not None
                for name in (output.values, output.indices) if name is not None}


def split_outputs(computed: dict[str, np.ndarray], output_names: Sequence[str], counts: list[int],
           ragged: dict[str, str]) -> list[list[np.ndarray]]:
    """Each member's slice of every output: ragged outputs by their lengths, the others by item."""
    item_bounds = np.concatenate([[0], np.cumsum(counts)])
    per_output = []
    for name in output_names:
        array = computed[name]
        if name in ragged:
            rows = np.concatenate([[0], np.cumsum(computed[ragged[name]])])
            bounds = rows[item_bounds]
        elif len(array) == 0:  # e.g. scores without a query
            bounds = np.zeros(len(item_bounds), dtype=np.int64)
        else:
            bounds = item_bounds
        per_output.append([array[bounds[i]:bounds[i + 1]] for i in range(len(counts))])
    return [list(parts) for parts in zip(*per_output, strict=True)]
