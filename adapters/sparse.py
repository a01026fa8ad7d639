"""``text_sparse``: SPLADE sparse embeddings over the vocabulary, and dot-product scores.

V2 interface (``max_batch_size: 0``):
  inputs   ``text`` BYTES [-1]; ``query`` BYTES [1], optional (for ``scores``)
  outputs  ``sparse_indices`` INT64 [-1] and ``sparse_values`` FP32 [-1]: the non-zero
           vocabulary weights of every text, ascending by index, item after item;
           ``sparse_lengths`` INT64 [-1]: non-zeros per text; ``scores`` FP32 [-1]: dot product
           of each text with the query (empty without a query).
The graph gives either pooled weights [batch, vocab] or MLM logits [batch, tokens, vocab]; the
latter are pooled as SPLADE does: max over real tokens of log(1 + relu(logit)). The vocabulary
size is written into the config as parameter ``vocab_size``. Request parameter ``instruction``
prefixes the query when one is sent, otherwise every text.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from adapters.base import Prepared, TextAdapter
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend, InputKind, OutputKind, Parameter, TextInput, TextOutput


class SparseAdapter(TextAdapter[Prepared]):
    """A SPLADE model (an ``Executable``; see the module docstring)."""

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        graph = self.session.outputs[0]
        if len(graph.shape) not in (2, 3) or graph.shape[-1] < 1:
            raise ValueError(f"output '{graph.name}' must be [batch, vocab] or [batch, tokens, vocab] with a fixed vocab")
        self._logits = len(graph.shape) == 3
        config.parameters["vocab_size"].string_value = str(graph.shape[-1])
        self.declare((TextInput(InputKind.TEXT), TextInput(InputKind.QUERY, optional=True)),
                     (TextOutput(OutputKind.SPARSE, "float32", graph.shape[-1], "sparse_values",
                                 lengths="sparse_lengths", indices="sparse_indices"),
                      TextOutput(OutputKind.SCORE, "float32", 0, "scores")))

    def preprocess(self, feeds: dict[str, np.ndarray], parameters: Mapping[str, Parameter]) -> Prepared:
        """The texts (and the query, last) tokenized, the instruction applied."""
        return self.encode_with_query(feeds, parameters)

    def postprocess(self, prepared: Prepared, graph: list[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """The non-zero vocabulary weights of each text, and its dot product with the query."""
        weights = graph[0]
        if self._logits:
            weights = splade_pool(weights, prepared.batch.feeds["attention_mask"])
        weights = weights.astype(np.float32, copy=False)
        out: dict[str, np.ndarray] = {"scores": np.zeros(0, dtype=np.float32)}
        if prepared.has_query:
            out["scores"] = (weights[:-1] @ weights[-1]).astype(np.float32)
            weights = weights[:-1]
        rows, columns = np.nonzero(weights)
        out["sparse_indices"] = columns.astype(np.int64)
        out["sparse_values"] = weights[rows, columns]
        out["sparse_lengths"] = np.bincount(rows, minlength=len(weights)).astype(np.int64)
        return out


def splade_pool(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """SPLADE's pooling: max over real tokens of log(1 + relu(logit)).

    Args:
        logits: MLM logits [items, tokens, vocab].
        mask: the attention mask [items, tokens] (padding never contributes).

    Returns:
        vocabulary weights [items, vocab], all >= 0.
    """
    weights: np.ndarray = (np.log1p(np.maximum(logits, 0)) * mask[..., None].astype(np.float32)).max(axis=1)
    return weights


# the ``text_sparse`` backend (entry point)
BACKEND = Backend(SparseAdapter, offers=(OutputKind.SPARSE, OutputKind.SCORE))
