"""``text_extraction``: token classification decoded into character spans (named entities).

V2 interface (``max_batch_size: 0``):
  inputs   ``text`` BYTES [-1]; ``labels`` BYTES [-1], optional: entity types to keep
           (case-insensitive; all when absent)
  outputs  ``entities`` BYTES [-1]: per text, a JSON array of
           ``{"text", "label", "score", "start", "end"}`` (character offsets into the text, end
           exclusive), in text order.
Decoding: softmax over each real token's logits (special tokens and padding skipped); a token
whose best label is ``O`` or scores under the threshold ends the open span; ``B-X`` opens a
span of type X, unless the token continues the word of an open X span (a word piece); ``I-X``
extends an open X span, or opens one. A span's score is its lowest token
score, its characters run from its first token's start offset to its last token's end offset.
Labels come from ``<version>/config.json`` ``id2label`` (Hugging Face's layout). Config
parameter ``threshold`` (default 0.5), which a request parameter of the same name overrides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from adapters.base import Clock, TextAdapter, text_input, texts
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Parameter
from kserve_v2.datatypes import BY_V2
from kserve_v2.errors import InvalidInput
from kserve_v2.runtime.onnx import OnnxTensor
from tokenizers import Encoding


class ExtractionAdapter(TextAdapter):
    """A token-classification model (an ``Executable``; see the module docstring)."""

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        labels = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))["id2label"]
        self._labels = [labels[str(i)] for i in range(len(labels))]
        graph = self.session.outputs[0]
        if len(graph.shape) != 3 or graph.shape[-1] not in (-1, len(self._labels)):
            raise ValueError(f"output '{graph.name}' must be logits [batch, tokens, {len(self._labels)}]")
        self._threshold = float(self.parameters.get("threshold") or 0.5)
        self.inputs = (text_input("text"), text_input("labels", optional=True))
        self.outputs = (OnnxTensor("entities", BY_V2["BYTES"], (-1,)),)

    def compute(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter],
                clock: Clock) -> tuple[dict[str, np.ndarray], int]:
        items = texts(feeds, "text")
        keep = {label.lower() for label in texts(feeds, "labels")} if "labels" in feeds else None
        threshold = parameters.get("threshold", self._threshold)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            raise InvalidInput("parameter 'threshold' must be a number between 0 and 1")
        batch = self.encode(items, parameters)
        logits = self.infer(batch, clock)[0].astype(np.float32, copy=False)
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
        best, scores = probabilities.argmax(axis=-1), probabilities.max(axis=-1)
        entities = np.empty(len(items), dtype=object)
        for i, (text, encoding) in enumerate(zip(items, batch.encodings, strict=True)):
            found = self._spans(text, encoding, best[i], scores[i], float(threshold))
            if keep is not None:
                found = [e for e in found if e["label"].lower() in keep]
            entities[i] = json.dumps(found).encode()
        return {"entities": entities}, batch.tokens

    def _spans(self, text: str, encoding: Encoding, best: np.ndarray, scores: np.ndarray,
               threshold: float) -> list[dict[str, Any]]:
        spans: list[dict[str, Any]] = []
        current: dict[str, Any] | None = None
        word_ids = encoding.word_ids
        for token, (special, real) in enumerate(zip(encoding.special_tokens_mask, encoding.attention_mask, strict=True)):
            if special or not real:
                continue
            label, score = self._labels[best[token]], float(scores[token])
            start, end = encoding.offsets[token]
            if label == "O" or score < threshold:
                current = None
                continue
            tag, kind = label.split("-", 1) if "-" in label else ("B", label)
            if current is not None and current["label"] == kind and (tag == "I" or current["word"] == word_ids[token]):
                current["end"], current["score"] = end, min(current["score"], score)
            else:
                current = {"label": kind, "score": score, "start": start, "end": end}
                spans.append(current)
            current["word"] = word_ids[token]
        return [{"text": text[s["start"]:s["end"]], "label": s["label"], "score": round(s["score"], 4),
                 "start": s["start"], "end": s["end"]} for s in spans]


def open_model(model_dir: Path, version: int, config: mc.ModelConfig) -> ExtractionAdapter:
    """The ``text_extraction`` backend's opener (entry point)."""
    return ExtractionAdapter(model_dir, version, config)
