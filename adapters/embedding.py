"""``text_embedding``: dense sentence embeddings, per-token multivectors, and bi-encoder scores.

V2 interface (``max_batch_size: 0``):
  inputs   ``text`` BYTES [-1]; ``query`` BYTES [1], optional (for ``scores``)
  outputs  ``dense`` FP32 [-1, D]; ``dense_fp16`` FP16 [-1, D]; ``dense_int8`` INT8 [-1, D]
           (round(x * 127), clipped); ``dense_binary`` UINT8 [-1, ceil(D/8)] (sign bits, packed
           big-endian as numpy's packbits); ``multivector`` FP32 [-1, D] (the real tokens of every
           item, item after item) with ``multivector_lengths`` INT64 [-1] (tokens per item), when
           the graph gives per-token states; ``scores`` FP32 [-1] (cosine of each text with the
           query; empty without a query).
Config parameters: ``pooling`` ``mean`` (masked mean of per-token states, sentence-transformers'
default), ``cls`` (first token), or ``none`` (the graph's own 2-D output); ``normalize``
(``true``: L2-normalise dense vectors and multivector rows). Request parameter ``instruction``
prefixes the query when one is sent, otherwise every text (SIE's query instruction); request
parameter ``token_ids`` = ``model`` reads each ``text`` item as a JSON array of the tokenizer's
own ids (``TextAdapter.item_texts``; OpenAI's token-array input).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from adapters.base import Clock, TextAdapter, l2_normalize, text_input
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Parameter
from kserve_v2.datatypes import BY_V2
from kserve_v2.runtime.onnx import OnnxTensor

POOLINGS = ("mean", "cls", "none")


class EmbeddingAdapter(TextAdapter):
    """A sentence-embedding model (an ``Executable``; see the module docstring)."""

    ragged = {"multivector": "multivector_lengths"}

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        graph = self.session.outputs
        per_token = [i for i, t in enumerate(graph) if len(t.shape) == 3]
        pooled = [i for i, t in enumerate(graph) if len(t.shape) == 2]
        self._pooling = self.parameters.get("pooling") or ("mean" if per_token else "none")
        if self._pooling not in POOLINGS:
            raise ValueError(f"pooling '{self._pooling}' is not one of {list(POOLINGS)}")
        candidates = pooled if self._pooling == "none" else per_token
        if not candidates:
            raise ValueError(f"pooling '{self._pooling}' needs a graph output of rank {2 if self._pooling == 'none' else 3}")
        self._source = candidates[0]
        self._per_token = per_token[0] if per_token else None
        self._normalize = self.parameters.get("normalize", "true").lower() != "false"
        dims = graph[self._source].shape[-1]
        if dims < 1:
            raise ValueError("the embedding width is not fixed in the graph")
        self.inputs = (text_input("text"), text_input("query", optional=True, shape=(1,)))
        outputs = [OnnxTensor("dense", BY_V2["FP32"], (-1, dims)), OnnxTensor("dense_fp16", BY_V2["FP16"], (-1, dims)),
                   OnnxTensor("dense_int8", BY_V2["INT8"], (-1, dims)),
                   OnnxTensor("dense_binary", BY_V2["UINT8"], (-1, (dims + 7) // 8))]
        if self._per_token is not None:
            outputs += [OnnxTensor("multivector", BY_V2["FP32"], (-1, dims)),
                        OnnxTensor("multivector_lengths", BY_V2["INT64"], (-1,))]
        self.outputs = (*outputs, OnnxTensor("scores", BY_V2["FP32"], (-1,)))

    def compute(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter],
                clock: Clock) -> tuple[dict[str, np.ndarray], int]:
        batch, has_query = self.encode_with_query(feeds, parameters)
        graph = self.infer(batch, clock)
        mask = batch.feeds["attention_mask"]
        dense = self._dense(graph, mask)
        out: dict[str, np.ndarray] = {}
        if has_query:
            unit = l2_normalize(dense)
            out["scores"] = (unit[:-1] @ unit[-1]).astype(np.float32)
            dense, mask, graph = dense[:-1], mask[:-1], [g[:-1] for g in graph]
        else:
            out["scores"] = np.zeros(0, dtype=np.float32)
        out["dense"] = dense
        if "dense_fp16" in wanted:
            out["dense_fp16"] = dense.astype(np.float16)
        if "dense_int8" in wanted:
            out["dense_int8"] = np.clip(np.rint(dense * 127), -128, 127).astype(np.int8)
        if "dense_binary" in wanted:
            out["dense_binary"] = np.packbits(dense > 0, axis=-1)
        if wanted & {"multivector", "multivector_lengths"} and self._per_token is not None:
            states = graph[self._per_token]
            rows = [states[i][mask[i].astype(bool)] for i in range(len(states))]
            vectors = np.concatenate(rows).astype(np.float32, copy=False)
            out["multivector"] = l2_normalize(vectors) if self._normalize else vectors
            out["multivector_lengths"] = np.array([len(r) for r in rows], dtype=np.int64)
        return out, batch.tokens

    def _dense(self, graph: list[np.ndarray], mask: np.ndarray) -> np.ndarray:
        return pool(graph[self._source], mask, self._pooling, self._normalize)


def pool(states: np.ndarray, mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    """One vector per item: float32 [items, D].

    Args:
        states: per-token states [items, tokens, D] (``mean``, ``cls``) or pooled vectors
            [items, D] (``none``).
        mask: the attention mask [items, tokens] (1 for real tokens); ``mean`` averages only those
            (sentence-transformers' mean pooling).
        pooling: one of ``POOLINGS``.
        normalize: L2-normalise each vector.
    """
    if pooling == "mean":
        weights = mask[..., None].astype(np.float32)
        states = (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    elif pooling == "cls":
        states = states[:, 0]
    states = states.astype(np.float32, copy=False)
    return l2_normalize(states) if normalize else states


def open_model(model_dir: Path, version: int, config: mc.ModelConfig) -> EmbeddingAdapter:
    """The ``text_embedding`` backend's opener (entry point)."""
    return EmbeddingAdapter(model_dir, version, config)
