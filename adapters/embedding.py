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

from adapters.base import Prepared, TextAdapter, l2_normalize
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend, InputKind, OutputKind, Parameter, TextInput, TextOutput

POOLINGS = ("mean", "cls", "none")
# SIE's output_dtype -> the V2 output with the dense vectors in that precision
DENSE_OUTPUTS = {"float32": "dense", "float16": "dense_fp16", "int8": "dense_int8", "binary": "dense_binary"}


class EmbeddingAdapter(TextAdapter[Prepared]):
    """A sentence-embedding model (an ``Executable``; see the module docstring)."""

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
        outputs = [TextOutput(OutputKind.DENSE, dtype, dims, name) for dtype, name in DENSE_OUTPUTS.items()]
        if self._per_token is not None:
            outputs.append(TextOutput(OutputKind.MULTIVECTOR, "float32", dims, "multivector",
                                      lengths="multivector_lengths"))
        outputs.append(TextOutput(OutputKind.SCORE, "float32", 0, "scores"))
        self.declare((TextInput(InputKind.TEXT), TextInput(InputKind.QUERY, optional=True)), outputs)

    def preprocess(self, feeds: dict[str, np.ndarray], parameters: Mapping[str, Parameter]) -> Prepared:
        """The texts (and the query, last) tokenized, the instruction applied."""
        return self.encode_with_query(feeds, parameters)

    def postprocess(self, prepared: Prepared, graph: list[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """Pooled (and normalised) vectors in every wanted precision, per-token vectors, query scores."""
        mask = prepared.batch.feeds["attention_mask"]
        dense = pool(graph[self._source], mask, self._pooling, self._normalize)
        out: dict[str, np.ndarray] = {}
        if prepared.has_query:
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
        return out


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


# the ``text_embedding`` backend (entry point)
BACKEND = Backend(EmbeddingAdapter, offers=(OutputKind.DENSE, OutputKind.SCORE))
