"""``text_rerank``: a cross-encoder scoring (query, text) pairs.

V2 interface (``max_batch_size: 0``):
  inputs   ``query`` BYTES [1]; ``text`` BYTES [-1]
  outputs  ``scores`` FP32 [-1]: one relevance score per text, in input order.
The graph gives logits [batch] or [batch, 1] (one relevance logit), or [batch, 2] (irrelevant,
relevant). Config parameter ``activation``: ``sigmoid`` (default; a softmax over two logits),
or ``none`` for raw logits. Request parameter ``instruction`` prefixes the query.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from adapters.base import Prepared, TextAdapter
from adapters.inputs import string_parameter, texts, with_instruction
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend, Parameter
from kserve_v2.text import InputKind, OutputKind, TextInput, TextOutput

ACTIVATIONS = ("sigmoid", "none")


class RerankAdapter(TextAdapter[Prepared]):
    """A cross-encoder (an ``Executable``; see the module docstring)."""

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        graph = self.session.outputs[0]
        if len(graph.shape) not in (1, 2) or (len(graph.shape) == 2 and graph.shape[1] not in (1, 2)):
            raise ValueError(f"output '{graph.name}' must be logits [batch], [batch, 1] or [batch, 2]")
        self._activation = self.parameters.get("activation") or "sigmoid"
        if self._activation not in ACTIVATIONS:
            raise ValueError(f"activation '{self._activation}' is not one of {list(ACTIVATIONS)}")
        self.declare((TextInput(InputKind.QUERY), TextInput(InputKind.TEXT)),
                     (TextOutput(OutputKind.SCORE, "float32", 0, "scores"),))

    def preprocess(self, feeds: dict[str, np.ndarray], parameters: Mapping[str, Parameter]) -> Prepared:
        """(query, text) pairs tokenized, the instruction prefixing the query."""
        query = with_instruction(string_parameter(parameters, "instruction", ""), texts(feeds, "query")[0])
        items = texts(feeds, "text")
        return Prepared(self.encode([(query, text) for text in items], parameters), items)

    def postprocess(self, prepared: Prepared, graph: list[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """One relevance score per pair (see the module docstring)."""
        return {"scores": relevance(graph[0], self._activation)}


def relevance(logits: np.ndarray, activation: str) -> np.ndarray:
    """Scores float32 [items] from logits [items], [items, 1] or [items, 2] (irrelevant, relevant).

    ``sigmoid`` of the relevant logit (a two-class softmax's second class is the sigmoid of the
    logits' difference); ``none``: the raw logit.
    """
    logits = logits.astype(np.float32, copy=False)
    if logits.ndim == 2 and logits.shape[1] == 2:
        logits = logits[:, 1] - logits[:, 0]
    logits = logits.reshape(len(logits))
    scores = 1 / (1 + np.exp(-logits)) if activation == "sigmoid" else logits
    return scores.astype(np.float32)


# the ``text_rerank`` backend (entry point)
BACKEND = Backend(RerankAdapter, offers=(OutputKind.SCORE,))
