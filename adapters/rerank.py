"""``text_rerank``: a cross-encoder scoring (query, text) pairs.

V2 interface (``max_batch_size: 0``):
  inputs   ``query`` BYTES [1] (needed for ``scores``; ``tokens`` alone need only the texts);
           ``text`` BYTES [-1]
  outputs  ``scores`` FP32 [-1]: one relevance score per text, in input order.
Each pair is tokenized together (``[CLS] query [SEP] text [SEP]``, token type ids 0 then 1, for
BERT-style tokenizers). The graph gives logits [batch] or [batch, 1] (one relevance logit), or
[batch, 2] (irrelevant, relevant). The activation follows sentence-transformers' ``CrossEncoder``:
the config parameter ``activation`` (``sigmoid`` or ``none``) when set, else the one the version
folder's ``config.json`` names (``sentence_transformers.activation_fn``, or the older
``sbert_ce_default_activation_function``: Sigmoid or Identity), else sigmoid (a model with one
label); over two logits, sigmoid is the softmax's relevant class. Request parameters:
``instruction`` prefixes the query, ``max_tokens_per_doc`` cuts each text to that many tokens
before pairing (Cohere's rerank v2), and those every text backend reads (``adapters.base``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from adapters.base import Prepared, TextAdapter
from adapters.inputs import int_parameter, string_parameter
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Backend, InputKind, OutputKind, Parameter, TextInput, TextOutput
from kserve_v2.protocol.errors import InvalidInput

ACTIVATIONS = ("sigmoid", "none")
# the class names sentence-transformers writes into config.json -> our activation
_CLASSES = {"Sigmoid": "sigmoid", "Identity": "none"}


class RerankAdapter(TextAdapter[Prepared]):
    """A cross-encoder (an ``Executable``; see the module docstring)."""

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        super().__init__(model_dir, version, config)
        graph = self.session.outputs[0]
        if len(graph.shape) not in (1, 2) or (len(graph.shape) == 2 and graph.shape[1] not in (1, 2)):
            raise ValueError(f"output '{graph.name}' must be logits [batch], [batch, 1] or [batch, 2]")
        self._activation = self.parameters.get("activation") or configured_activation(self.folder / "config.json")
        if self._activation not in ACTIVATIONS:
            raise ValueError(f"activation '{self._activation}' is not one of {list(ACTIVATIONS)}")
        config.parameters["activation"].string_value = self._activation
        self.declare((TextInput(InputKind.QUERY, optional=True), TextInput(InputKind.TEXT)),
                     (TextOutput(OutputKind.SCORE, "float32", 0, "scores"),))

    def preprocess(self, feeds: dict[str, np.ndarray], parameters: Mapping[str, Parameter]) -> Prepared:
        """(query, text) pairs tokenized: the query with its prefix and instruction, each text cut
        to ``max_tokens_per_doc`` tokens, then given its prefix.

        Raises:
            InvalidInput: no ``query`` input, or a bad parameter -> 400.
        """
        if "query" not in feeds:
            raise InvalidInput(f"model '{self.name}' scores pairs: input 'query' is required")
        query = self.query(feeds, parameters)
        items = self.item_texts(feeds, parameters)
        limit = int_parameter(parameters, "max_tokens_per_doc")
        documents = items if limit is None else self.tokenizer.cut(
            items, limit, string_parameter(parameters, "truncation_direction", "right"))
        pairs = [(query, text) for text in self.prompted(documents, parameters, instruct=False)]
        return Prepared(self.encode(pairs, parameters), items)

    def postprocess(self, prepared: Prepared, graph: list[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """One relevance score per pair (see the module docstring)."""
        return {"scores": relevance(graph[0], self._activation)}


def configured_activation(path: Path) -> str:
    """The activation a cross-encoder's ``config.json`` names, as sentence-transformers reads it;
    ``sigmoid`` when it names none (or there is no file).

    Raises:
        ValueError: it names an activation other than Sigmoid or Identity (a load failure).
    """
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    named = (config.get("sentence_transformers") or {}).get("activation_fn") or config.get(
        "sbert_ce_default_activation_function")
    if not named:
        return "sigmoid"
    activation = _CLASSES.get(str(named).rsplit(".", 1)[-1])
    if activation is None:
        raise ValueError(f"config.json names activation '{named}': only Sigmoid and Identity are supported "
                         f"(set the config parameter 'activation')")
    return activation


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
