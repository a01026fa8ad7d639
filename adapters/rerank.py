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

from adapters.base import Clock, TextAdapter, string_parameter, text_input, texts, with_instruction
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Parameter
from kserve_v2.datatypes import BY_V2
from kserve_v2.runtime.onnx import OnnxTensor

ACTIVATIONS = ("sigmoid", "none")


class RerankAdapter(TextAdapter):
    """A cross-encoder (an ``Executable``; see the module docstring)."""

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        graph = self.session.outputs[0]
        if len(graph.shape) not in (1, 2) or (len(graph.shape) == 2 and graph.shape[1] not in (1, 2)):
            raise ValueError(f"output '{graph.name}' must be logits [batch], [batch, 1] or [batch, 2]")
        self._activation = self.parameters.get("activation") or "sigmoid"
        if self._activation not in ACTIVATIONS:
            raise ValueError(f"activation '{self._activation}' is not one of {list(ACTIVATIONS)}")
        self.inputs = (text_input("query", shape=(1,)), text_input("text"))
        self.outputs = (OnnxTensor("scores", BY_V2["FP32"], (-1,)),)

    def compute(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter],
                clock: Clock) -> tuple[dict[str, np.ndarray], int]:
        query = with_instruction(string_parameter(parameters, "instruction", ""), texts(feeds, "query")[0])
        batch = self.encode([(query, text) for text in texts(feeds, "text")], parameters)
        logits = self.infer(batch, clock)[0].astype(np.float32, copy=False)
        if logits.ndim == 2 and logits.shape[1] == 2:
            logits = logits[:, 1] - logits[:, 0]  # softmax's second class = sigmoid of the difference
        logits = logits.reshape(len(logits))
        scores = 1 / (1 + np.exp(-logits)) if self._activation == "sigmoid" else logits
        return {"scores": scores.astype(np.float32)}, batch.tokens


def open_model(model_dir: Path, version: int, config: mc.ModelConfig) -> RerankAdapter:
    """The ``text_rerank`` backend's opener (entry point)."""
    return RerankAdapter(model_dir, version, config)
