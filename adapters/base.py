"""The shared part of every text backend: pre (tokenize) -> core (ONNX Runtime) -> post.

A text model's folder holds ``<version>/model.onnx`` and ``<version>/tokenizer.json``; its
``config.pbtxt`` names the backend and may set ``parameters``: ``max_sequence_length`` (tokens
per item; default: the tokenizer file's truncation, else 512), ``query_prefix`` and
``document_prefix`` (prepended verbatim to queries and to the other texts, as
sentence-transformers' ``prompts`` and text-embeddings-inference's ``prompt_name`` do: ``"query: "``
for E5 models), plus the backend's own. Request parameters every text backend reads:
``overflow_policy`` (``default``, ``truncate_text``, ``error``; SIE's ``options.overflow_policy``),
``truncation_direction`` (``right`` keeps a long text's start, ``left`` its end), ``prompt_name``
(``document``, the default, or ``query``: which prefix the ``text`` items get), ``instruction``
(SIE's). Every text model also gives the V2 outputs ``tokens`` (INT64 [-1, 4]: id, start, stop,
special for each token, item after item) and ``token_lengths`` (INT64 [-1]); asked for alone, they
tokenize without truncation and without running the model (request parameter
``add_special_tokens``, default true). Only ``infer`` touches ORT.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from adapters.batching import TextBatching
from adapters.inputs import flag_parameter, string_parameter, texts, with_instruction
from adapters.tokenizer import TOKEN_COLUMNS, Batch, TextTokenizer
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import (NO_CONTEXT, Execution, InputKind, OutputKind, Parameter, RequestContext, TensorDeclaration,
                               TextContract, TextInput, TextOutput)
from kserve_v2.protocol.datatypes import BY_V2, BYTES
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.runtime.onnx import open_session

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MAX_LENGTH = 512
# the prompts a request's ``prompt_name`` may choose, each from the config parameter ``<name>_prefix``
PROMPTS = ("document", "query")
TOKENS = TextOutput(OutputKind.TOKENS, "int64", TOKEN_COLUMNS, "tokens", lengths="token_lengths")
TOKEN_OUTPUTS = frozenset(TOKENS.tensors)


@dataclass(slots=True)
class Prepared:
    """A request after pre-processing: the tokenized batch, and what post-processing reads.

    Attributes:
        batch: the tokenized items (int64 [rows, tokens] feeds); with a query, its last row.
        items: the items' texts, in order.
        has_query: whether the batch's last row is the query.
    """

    batch: Batch
    items: list[str]
    has_query: bool = False


P = TypeVar("P", bound=Prepared)


class TextAdapter(Generic[P]):
    """Base class of the text backends (an ``Executable``): pre-process (read the texts and
    tokenize), execute (ONNX Runtime), post-process (pool, score, decode).

    A subclass sets ``text`` (its ``TextContract``; the V2 interface is derived from it) in its
    constructor and implements ``preprocess`` and ``postprocess``. Thread-safe: the tokenizer and
    the session are only read.
    """

    batchable = False
    threaded = False
    inputs: tuple[TensorDeclaration, ...]
    outputs: tuple[TensorDeclaration, ...]
    text: TextContract

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        """Open the tokenizer and the ONNX session, and write ``max_sequence_length`` into the config.

        Raises:
            FileNotFoundError: no model.onnx or tokenizer.json; ValueError: a malformed parameter;
            anything ORT or tokenizers raise for unreadable files (the load failure reason).
        """
        self.folder = model_dir / str(version)
        self.name = config.name
        self.parameters = {key: value.string_value for key, value in config.parameters.items()}
        self.prefixes = {name: self.parameters.get(f"{name}_prefix", "") for name in PROMPTS}
        for required in ("model.onnx", TOKENIZER_FILE):
            if not (self.folder / required).is_file():
                raise FileNotFoundError(f"'{version}/{required}' not found")
        max_length = int(self.parameters.get("max_sequence_length") or _file_max_length(self.folder / TOKENIZER_FILE))
        if max_length < 2:
            raise ValueError(f"max_sequence_length must be >= 2, got {max_length}")
        config.parameters["max_sequence_length"].string_value = str(max_length)
        self.tokenizer = TextTokenizer(self.folder / TOKENIZER_FILE, max_length, config.name)
        # transformer executions take milliseconds, with hundreds of parallel sections each: a pool
        # that sleeps between them cost one-text embeddings from 4 callers a fifth of their texts/s
        self.session = open_session(self.folder / "model.onnx", config, spinning=True)
        self.on_cuda = self.session.on_cuda
        self.batching = TextBatching(self)
        self._graph_inputs = [t.name for t in self.session.inputs]

    def declare(self, inputs: Sequence[TextInput], outputs: Sequence[TextOutput]) -> None:
        """Set ``text`` and the V2 interface it implies (see ``v2_interface``); the ``tokens`` output is added."""
        self.text = TextContract(tuple(inputs), (*outputs, TOKENS), self.tokenizer.max_length)
        self.inputs, self.outputs = v2_interface(self.text)

    # ---- the three steps ----

    def preprocess(self, feeds: dict[str, np.ndarray], parameters: Mapping[str, Parameter]) -> P:
        """Read the request's texts and tokenize them.

        Raises:
            InvalidInput, InputTooLong: bad texts or parameters -> INVALID_ARGUMENT / 400.
        """
        raise NotImplementedError

    def infer(self, batch: Batch) -> list[np.ndarray]:
        """Run the ONNX model on a tokenized batch; every graph output, in graph order."""
        feeds = {name: batch.feeds[name] for name in self._graph_inputs}
        return self.session.run(feeds, [t.name for t in self.session.outputs])

    def postprocess(self, prepared: P, graph: list[np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
        """Output name -> array for at least every ``wanted`` V2 output."""
        raise NotImplementedError

    def run_steps(self, feeds: dict[str, np.ndarray], wanted: set[str],
                  parameters: Mapping[str, Parameter]) -> tuple[dict[str, np.ndarray], Prepared, int, int]:
        """The three steps: (outputs, the pre-processed request, pre_ns, post_ns); only the
        tokenizer when ``tokens`` alone are wanted."""
        started = time.perf_counter_ns()
        if wanted <= TOKEN_OUTPUTS:
            whole = self.tokenize(feeds, parameters)
            return token_outputs(whole), whole, time.perf_counter_ns() - started, 0
        prepared = self.preprocess(feeds, parameters)
        ran = time.perf_counter_ns()
        graph = self.infer(prepared.batch)
        done = time.perf_counter_ns()
        computed = self.postprocess(prepared, graph, wanted)
        if wanted & TOKEN_OUTPUTS:
            computed.update(token_outputs(prepared))
        return computed, prepared, ran - started, time.perf_counter_ns() - done

    def check(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter]) -> None:
        """Raise what ``run_steps`` would raise before running the model (bad texts or parameters,
        an item over the limit under the ``error`` policy): text batching checks each request so."""
        if wanted <= TOKEN_OUTPUTS:
            self.tokenize(feeds, parameters)
        else:
            self.preprocess(feeds, parameters)

    def tokenize(self, feeds: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]) -> Prepared:
        """The ``text`` items as the model would see them (prompt prefix and instruction applied),
        tokenized without truncation (``add_special_tokens``: false leaves out [CLS], [SEP] and the like)."""
        items = self.prompted(self.item_texts(feeds, parameters), parameters, instruct=True)
        return Prepared(self.tokenizer.whole(items, flag_parameter(parameters, "add_special_tokens", True)), items)

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter], context: RequestContext = NO_CONTEXT) -> Execution:
        """Run one request; its outputs in the requested order (its context does not concern text models)."""
        computed, prepared, pre_ns, post_ns = self.run_steps(feeds, set(output_names), parameters)
        return Execution([computed[name] for name in output_names], pre_ns, post_ns, prepared.batch.tokens)

    def close(self) -> None:
        """Nothing to do: the tokenizer and the session go with the last reference to the model."""

    # ---- helpers of the pre-processing step ----

    def encode_with_query(self, feeds: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]) -> Prepared:
        """Tokenize the texts and, when the request has one, the query as the last item; the
        ``instruction`` prefixes the query when there is one, otherwise every text."""
        items = self.item_texts(feeds, parameters)
        if "query" in feeds:
            encoded = [*self.prompted(items, parameters, instruct=False), self.query(feeds, parameters)]
        else:
            encoded = self.prompted(items, parameters, instruct=True)
        return Prepared(self.encode(encoded, parameters), items, "query" in feeds)

    def prompted(self, items: Sequence[str], parameters: Mapping[str, Parameter], instruct: bool) -> list[str]:
        """The items with the prefix ``prompt_name`` chooses (``document`` unless it says ``query``),
        and with ``instruct`` the request's ``instruction`` before it.

        Raises:
            InvalidInput: an unknown ``prompt_name`` -> 400.
        """
        name = string_parameter(parameters, "prompt_name", "document")
        if name not in PROMPTS:
            raise InvalidInput(f"unknown prompt_name '{name}': use one of {list(PROMPTS)}")
        instruction = string_parameter(parameters, "instruction", "") if instruct else ""
        return [with_instruction(instruction, self.prefixes[name] + item) for item in items]

    def query(self, feeds: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]) -> str:
        """The ``query`` input with the model's query prefix, after the request's ``instruction``."""
        return with_instruction(string_parameter(parameters, "instruction", ""),
                                self.prefixes["query"] + texts(feeds, "query")[0])

    def item_texts(self, feeds: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]) -> list[str]:
        """The ``text`` items; with the request parameter ``token_ids`` = ``model``, each item is a JSON
        array of the model tokenizer's own ids, decoded with that tokenizer (``TextTokenizer.decode_ids``).

        Raises:
            InvalidInput: see ``texts``; an unknown ``token_ids`` value, or bad ids -> 400.
        """
        items = texts(feeds, "text")
        mode = string_parameter(parameters, "token_ids", "")
        if not mode:
            return items
        if mode != "model":
            raise InvalidInput(f"parameter 'token_ids' must be 'model', got '{mode}'")
        return self.tokenizer.decode_ids(items)

    def encode(self, items: Sequence[str | tuple[str, str]], parameters: Mapping[str, Parameter]) -> Batch:
        """Tokenize under the request's ``overflow_policy`` and ``truncation_direction`` (see ``TextTokenizer.encode``)."""
        return self.tokenizer.encode(items, string_parameter(parameters, "overflow_policy", "default"),
                                     string_parameter(parameters, "truncation_direction", "right"))


# SIE's output dtype -> the V2 datatype of its values
V2_DATATYPES = {"float32": "FP32", "float16": "FP16", "int8": "INT8", "binary": "UINT8", "json": "BYTES",
                "int64": "INT64"}


def v2_interface(contract: TextContract) -> tuple[tuple[TensorDeclaration, ...], tuple[TensorDeclaration, ...]]:
    """The V2 inputs and outputs a text contract implies.

    Inputs are BYTES, ``query`` [1] and the others [-1]. Each output gives, in order, its
    ``indices`` INT64 [-1], its ``values`` ([-1] for a scalar, a JSON document or a sparse value;
    [-1, width] for a vector, ``binary`` packing 8 components a byte) and its ``lengths`` INT64 [-1].
    """
    inputs = tuple(TensorDeclaration(i.kind.value, BYTES, (1,) if i.kind is InputKind.QUERY else (-1,), i.optional)
                   for i in contract.inputs)
    outputs: list[TensorDeclaration] = []
    for output in contract.outputs:
        if output.indices is not None:
            outputs.append(TensorDeclaration(output.indices, BY_V2["INT64"], (-1,)))
        width = (output.width + 7) // 8 if output.dtype == "binary" else output.width
        shape = (-1,) if not width or output.indices is not None else (-1, width)
        outputs.append(TensorDeclaration(output.values, BY_V2[V2_DATATYPES[output.dtype]], shape))
        if output.lengths is not None:
            outputs.append(TensorDeclaration(output.lengths, BY_V2["INT64"], (-1,)))
    return inputs, tuple(outputs)


def token_outputs(prepared: Prepared) -> dict[str, np.ndarray]:
    """The ``tokens`` and ``token_lengths`` outputs of the request's items (a query row is left out)."""
    rows, lengths = TextTokenizer.token_rows(prepared.batch, len(prepared.items))
    return {"tokens": rows, "token_lengths": lengths}


def l2_normalize(array: np.ndarray) -> np.ndarray:
    """Rows (last axis) scaled to unit length; zero rows stay zero. float32 in, float32 out."""
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    normalized: np.ndarray = array / np.maximum(norms, 1e-12)
    return normalized


def _file_max_length(path: Path) -> int:
    truncation = json.loads(path.read_text(encoding="utf-8")).get("truncation") or {}
    return int(truncation.get("max_length") or DEFAULT_MAX_LENGTH)
