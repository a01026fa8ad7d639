"""``text_extraction``: token classification decoded into character spans (named entities).

V2 interface (``max_batch_size: 0``):
  inputs   ``text`` BYTES [-1]; ``labels`` BYTES [-1], optional: entity types to keep
           (case-insensitive; all when absent)
  outputs  ``entities`` BYTES [-1]: per text, a JSON array of
           ``{"text", "label", "score", "start", "end"}`` (character offsets into the text, end
           exclusive), in text order.
Decoding: softmax over each real token's logits (special tokens and padding skipped), then one of
the aggregation strategies of token-classification pipelines (Hugging Face ``transformers``
``TokenClassificationPipeline``), named by the request parameter ``aggregation_strategy``:
``simple`` (every token keeps its own best label), ``first`` (the default: a word takes its first
token's label, so an e-mail address the model tags piece by piece stays one span), ``max`` (the label of its highest-scoring token), ``average`` (the best label of
its tokens' mean probabilities) - a word is what the tokenizer's pre-tokenizer splits - or
``none`` (every token its own entity, no merging). Units (tokens, or words) whose label is ``O`` or
whose score is under the threshold end the open span; a unit of type X joins an open X span when
it is tagged ``I-X``, continues the span's last word, or starts where the span ends (no gap: the
pieces of an e-mail address or a phone number); otherwise it opens a span. A span's score is its
lowest unit score; its characters run from its first token's start offset to its last token's
end offset. Labels come from ``<version>/config.json`` ``id2label`` (Hugging Face's layout).
Config parameter ``threshold`` (default 0.5), which a request parameter of the same name overrides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adapters.base import Prepared, TextAdapter
from adapters.inputs import string_parameter, texts
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend, InputKind, OutputKind, Parameter, TextInput, TextOutput
from kserve_v2.protocol.errors import InvalidInput
from tokenizers import Encoding

AGGREGATION_STRATEGIES = ("simple", "first", "max", "average", "none")
WORD_STRATEGIES = ("first", "max", "average")


@dataclass(slots=True)
class _Request(Prepared):
    """A pre-processed extraction request: the tokenized texts and how to decode them."""

    keep: set[str] | None = None  # lower-cased labels to keep; None: all
    threshold: float = 0.5
    strategy: str = "first"


class ExtractionAdapter(TextAdapter[_Request]):
    """A token-classification model (an ``Executable``; see the module docstring)."""

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        labels = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))["id2label"]
        self._labels = [labels[str(i)] for i in range(len(labels))]
        graph = self.session.outputs[0]
        if len(graph.shape) != 3 or graph.shape[-1] not in (-1, len(self._labels)):
            raise ValueError(f"output '{graph.name}' must be logits [batch, tokens, {len(self._labels)}]")
        self._threshold = float(self.parameters.get("threshold") or 0.5)
        self.declare((TextInput(InputKind.TEXT), TextInput(InputKind.LABELS, optional=True)),
                     (TextOutput(OutputKind.ENTITIES, "json", 0, "entities"),))

    def preprocess(self, feeds: dict[str, np.ndarray], parameters: Mapping[str, Parameter]) -> _Request:
        """The texts tokenized; the labels to keep, the threshold and the aggregation strategy checked.

        Raises:
            InvalidInput: a threshold outside [0, 1] or an unknown aggregation strategy -> 400.
        """
        items = texts(feeds, "text")
        keep = {label.lower() for label in texts(feeds, "labels")} if "labels" in feeds else None
        threshold = parameters.get("threshold", self._threshold)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            raise InvalidInput("parameter 'threshold' must be a number between 0 and 1")
        strategy = string_parameter(parameters, "aggregation_strategy", "first")
        if strategy not in AGGREGATION_STRATEGIES:
            raise InvalidInput(f"unknown aggregation_strategy '{strategy}': use one of {list(AGGREGATION_STRATEGIES)}")
        return _Request(self.encode(items, parameters), items, keep=keep, threshold=float(threshold), strategy=strategy)

    def postprocess(self, prepared: _Request, graph: list[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """Per text, its entities as a JSON array (see the module docstring)."""
        logits = graph[0].astype(np.float32, copy=False)
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
        entities = np.empty(len(prepared.items), dtype=object)
        for i, (text, encoding) in enumerate(zip(prepared.items, prepared.batch.encodings, strict=True)):
            units = _units(encoding, probabilities[i], prepared.strategy)
            found = self._spans(text, units, prepared.threshold, merge=prepared.strategy != "none")
            if prepared.keep is not None:
                found = [e for e in found if e["label"].lower() in prepared.keep]
            entities[i] = json.dumps(found).encode()
        return {"entities": entities}

    def _spans(self, text: str, units: list[_Unit], threshold: float, merge: bool) -> list[dict[str, Any]]:
        spans: list[dict[str, Any]] = []
        current: dict[str, Any] | None = None
        for unit in units:
            label = self._labels[unit.label]
            if label == "O" or unit.score < threshold:
                current = None
                continue
            tag, kind = label.split("-", 1) if "-" in label else ("B", label)
            if (merge and current is not None and current["label"] == kind
                    and (tag == "I" or current["word"] == unit.word or current["end"] == unit.start)):
                current["end"], current["score"] = unit.end, min(current["score"], unit.score)
            else:
                current = {"label": kind, "score": unit.score, "start": unit.start, "end": unit.end}
                spans.append(current)
            current["word"] = unit.word
        return [{"text": text[s["start"]:s["end"]], "label": s["label"], "score": round(s["score"], 4),
                 "start": s["start"], "end": s["end"]} for s in spans]


@dataclass(frozen=True, slots=True)
class _Unit:
    """A token, or a word, with its chosen label index and score, and its character span."""

    label: int
    score: float
    start: int
    end: int
    word: int | None


def _units(encoding: Encoding, probabilities: np.ndarray, strategy: str) -> list[_Unit]:
    """The real tokens (``simple``, ``none``) or words (``first``, ``max``, ``average``) of one text."""
    tokens = [t for t, (special, real) in enumerate(zip(encoding.special_tokens_mask, encoding.attention_mask,
                                                          strict=True)) if real and not special]
    word_ids, offsets = encoding.word_ids, encoding.offsets  # each attribute read builds a new list
    groups: list[list[int]] = []
    for token in tokens:
        word = word_ids[token]
        if strategy in WORD_STRATEGIES and groups and word is not None and word_ids[groups[-1][0]] == word:
            groups[-1].append(token)
        else:
            groups.append([token])
    units = []
    for group in groups:
        rows = probabilities[group]
        if strategy == "average":
            mean = rows.mean(axis=0)
            label, score = int(mean.argmax()), float(mean.max())
        else:
            best = int(rows.max(axis=-1).argmax()) if strategy == "max" else 0
            label, score = int(rows[best].argmax()), float(rows[best].max())
        units.append(_Unit(label, score, offsets[group[0]][0], offsets[group[-1]][1], word_ids[group[0]]))
    return units


# the ``text_extraction`` backend (entry point)
BACKEND = Backend(ExtractionAdapter, offers=(OutputKind.ENTITIES,))
