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

from adapters.base import Clock, TextAdapter, text_input
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Parameter
from kserve_v2.datatypes import BY_V2
from kserve_v2.runtime.onnx import OnnxTensor


class SparseAdapter(TextAdapter):
    """A SPLADE model (an ``Executable``; see the module docstring)."""

    ragged = {"sparse_indices": "sparse_lengths", "sparse_values": "sparse_lengths"}

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        graph = self.session.outputs[0]
        if len(graph.shape) not in (2, 3) or graph.shape[-1] < 1:
            raise ValueError(f"output '{graph.name}' must be [batch, vocab] or [batch, tokens, vocab] with a fixed vocab")
        self._logits = len(graph.shape) == 3
        config.parameters["vocab_size"].string_value = str(graph.shape[-1])
        self.inputs = (text_input("text"), text_input("query", optional=True, shape=(1,)))
        self.outputs = (OnnxTensor("sparse_indices", BY_V2["INT64"], (-1,)),
                        OnnxTensor("sparse_values", BY_V2["FP32"], (-1,)),
                        OnnxTensor("sparse_lengths", BY_V2["INT64"], (-1,)),
                        OnnxTensor("scores", BY_V2["FP32"], (-1,)))

    def compute(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter],
                clock: Clock) -> tuple[dict[str, np.ndarray], int]:
        batch, has_query = self.encode_with_query(feeds, parameters)
        weights = self.infer(batch, clock)[0]
        if self._logits:
            weights = splade_pool(weights, batch.feeds["attention_mask"])
        weights = weights.astype(np.float32, copy=False)
        out: dict[str, np.ndarray] = {"scores": np.zeros(0, dtype=np.float32)}
        if has_query:
            out["scores"] = (weights[:-1] @ weights[-1]).astype(np.float32)
            weights = weights[:-1]
        rows, columns = np.nonzero(weights)
        out["sparse_indices"] = columns.astype(np.int64)
        out["sparse_values"] = weights[rows, columns]
        out["sparse_lengths"] = np.bincount(rows, minlength=len(weights)).astype(np.int64)
        return out, batch.tokens


def splade_pool(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """SPLADE's pooling: max over real tokens of log(1 + relu(logit)).

    Args:
        logits: MLM logits [items, tokens, vocab].
        mask: the attention mask [items, tokens] (padding never contributes).

    Returns:
        vocabulary weights [items, vocab], all >= 0.
    """
    return (np.log1p(np.maximum(logits, 0)) * mask[..., None].astype(np.float32)).max(axis=1)


def open_model(model_dir: Path, version: int, config: mc.ModelConfig) -> SparseAdapter:
    """The ``text_sparse`` backend's opener (entry point)."""
    return SparseAdapter(model_dir, version, config)
