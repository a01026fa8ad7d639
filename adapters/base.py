"""The shared part of every text backend: pre (tokenize) -> core (ONNX Runtime) -> post.

A text model's folder holds ``<version>/model.onnx`` and ``<version>/tokenizer.json``; its
``config.pbtxt`` names the backend and may set ``parameters``:
``max_sequence_length`` (tokens per item; default: the tokenizer file's truncation, else 512)
plus the backend's own. Requests may carry the parameter ``overflow_policy`` (``default``,
``truncate_text``, ``error``; SIE's ``options.overflow_policy``). Only ``infer`` touches ORT.
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np

from adapters.tokenizer import OVERFLOW_POLICIES, Batch, TextTokenizer
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import Execution, Parameter
from kserve_v2.datatypes import BYTES
from kserve_v2.errors import InvalidInput, ServerError
from kserve_v2.runtime.onnx import OnnxTensor, open_session

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MAX_LENGTH = 512


class Clock:
    """Splits one execution into pre, model and post time (ns)."""

    def __init__(self) -> None:
        self.started = time.perf_counter_ns()
        self.first_model = 0
        self.model_ns = 0
        self.item_tokens: np.ndarray = np.zeros(0, dtype=np.int64)  # real tokens per item of the last model run

    def execution(self, outputs: list[np.ndarray], tokens: int, executions: int = 1) -> Execution:
        total = time.perf_counter_ns() - self.started
        pre = (self.first_model or time.perf_counter_ns()) - self.started
        return Execution(outputs, pre, max(total - pre - self.model_ns, 0), tokens, executions)


class TextAdapter:
    """Base class of the text backends (an ``Executable``).

    Subclasses set ``inputs`` and ``outputs`` (the V2 interface) and implement ``compute``.
    Thread-safe: the tokenizer and the session are only read.
    """

    batchable = False
    inputs: tuple[OnnxTensor, ...]
    outputs: tuple[OnnxTensor, ...]
    # outputs that are ragged across texts -> the output giving their rows per text
    ragged: dict[str, str] = {}

    def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
        """Open the tokenizer and the ONNX session, and write ``max_sequence_length`` into the config.

        Raises:
            FileNotFoundError: no model.onnx or tokenizer.json; ValueError: a malformed parameter;
            anything ORT or tokenizers raise for unreadable files (the load failure reason).
        """
        self.folder = model_dir / str(version)
        self.name = config.name
        self.parameters = {key: value.string_value for key, value in config.parameters.items()}
        for required in ("model.onnx", TOKENIZER_FILE):
            if not (self.folder / required).is_file():
                raise FileNotFoundError(f"'{version}/{required}' not found")
        max_length = int(self.parameters.get("max_sequence_length") or _file_max_length(self.folder / TOKENIZER_FILE))
        if max_length < 2:
            raise ValueError(f"max_sequence_length must be >= 2, got {max_length}")
        config.parameters["max_sequence_length"].string_value = str(max_length)
        self.tokenizer = TextTokenizer(self.folder / TOKENIZER_FILE, max_length, config.name)
        self.session = open_session(self.folder / "model.onnx", config)
        self.on_cuda = self.session.on_cuda
        self._graph_inputs = [t.name for t in self.session.inputs]

    def execute(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                parameters: Mapping[str, Parameter]) -> Execution:
        """Run one request: ``compute`` gives every wanted output; return them in the requested order."""
        clock = Clock()
        computed, tokens = self.compute(feeds, set(output_names), parameters, clock)
        return clock.execution([computed[name] for name in output_names], tokens)

    # ---- dynamic batching at the text level (kserve_v2.backend.BatchesTexts) ----

    def batch_key(self, feeds: dict[str, np.ndarray], output_names: Sequence[str],
                  parameters: Mapping[str, Parameter]) -> Hashable:
        """Requests merge when they ask the same outputs with the same parameters and non-text inputs."""
        others = tuple((name, tuple(bytes(v) for v in array.reshape(-1))) for name, array in sorted(feeds.items())
                       if name != "text")
        return tuple(output_names), tuple(sorted((k, str(v)) for k, v in parameters.items())), others

    def batch_items(self, feeds: dict[str, np.ndarray]) -> int:
        """The texts of a request."""
        return len(feeds["text"])

    def execute_batch(self, members: list[dict[str, np.ndarray]], output_names: Sequence[str],
                      parameters: Mapping[str, Parameter]) -> list[Execution | Exception]:
        """Tokenize every member's texts as one batch (padded to its longest), run once, split back.

        Each member's texts, and its lengths under the ``error`` overflow policy, are checked
        first, so a bad request fails alone.
        """
        clock = Clock()
        shares: list[Execution | Exception | None] = [None] * len(members)
        try:
            policy = string_parameter(parameters, "overflow_policy", "default")
            if policy not in OVERFLOW_POLICIES:
                raise InvalidInput(f"unknown overflow_policy '{policy}': use one of {list(OVERFLOW_POLICIES)}")
        except ServerError as err:
            return [err] * len(members)
        valid: list[int] = []
        for index, feeds in enumerate(members):
            try:
                items = self.item_texts(feeds, parameters)
                if policy == "error":
                    self.tokenizer.encode(items, "error")
                valid.append(index)
            except ServerError as err:
                shares[index] = err
        if valid:
            merged = {**members[valid[0]], "text": np.concatenate([members[i]["text"] for i in valid])}
            wanted = set(output_names) | {self.ragged[n] for n in output_names if n in self.ragged}
            checked = {**parameters, "overflow_policy": "truncate_text"} if policy == "error" else parameters
            computed, tokens = self.compute(merged, wanted, checked, clock)
            counts = [len(members[i]["text"]) for i in valid]
            bounds = np.concatenate([[0], np.cumsum(counts)])
            own = [int(clock.item_tokens[bounds[i]:bounds[i + 1]].sum()) for i in range(len(counts))]
            own[0] += tokens - sum(own)  # a shared query's tokens
            for position, (index, outputs) in enumerate(zip(valid, self._split(computed, output_names, counts),
                                                            strict=True)):
                shares[index] = clock.execution(outputs, own[position], int(position == 0))
        return [share for share in shares if share is not None]

    def _split(self, computed: dict[str, np.ndarray], output_names: Sequence[str], counts: list[int]
               ) -> list[list[np.ndarray]]:
        item_bounds = np.concatenate([[0], np.cumsum(counts)])
        per_output = []
        for name in output_names:
            array = computed[name]
            if name in self.ragged:
                rows = np.concatenate([[0], np.cumsum(computed[self.ragged[name]])])
                bounds = rows[item_bounds]
            elif len(array) == 0:  # e.g. scores without a query
                bounds = np.zeros(len(item_bounds), dtype=np.int64)
            else:
                bounds = item_bounds
            per_output.append([array[bounds[i]:bounds[i + 1]] for i in range(len(counts))])
        return [list(parts) for parts in zip(*per_output, strict=True)]

    def compute(self, feeds: dict[str, np.ndarray], wanted: set[str], parameters: Mapping[str, Parameter],
                clock: Clock) -> tuple[dict[str, np.ndarray], int]:
        """Return (output name -> array for at least every ``wanted`` name, tokens processed)."""
        raise NotImplementedError

    def infer(self, batch: Batch, clock: Clock) -> list[np.ndarray]:
        """Run the ONNX model on a tokenized batch; every graph output, in graph order."""
        started = time.perf_counter_ns()
        clock.first_model = clock.first_model or started
        clock.item_tokens = batch.feeds["attention_mask"].sum(axis=1)
        feeds = {name: batch.feeds[name] for name in self._graph_inputs}
        outputs = self.session.run(feeds, [t.name for t in self.session.outputs])
        clock.model_ns += time.perf_counter_ns() - started
        return outputs

    def encode_with_query(self, feeds: Mapping[str, np.ndarray], parameters: Mapping[str, Parameter]
                          ) -> tuple[Batch, bool]:
        """Tokenize the texts and, when the request has one, the query as the last item; the
        ``instruction`` prefixes the query when there is one, otherwise every text.

        Returns:
            (batch, whether its last item is the query).
        """
        items = self.item_texts(feeds, parameters)
        instruction = string_parameter(parameters, "instruction", "")
        if "query" in feeds:
            items.append(with_instruction(instruction, texts(feeds, "query")[0]))
        else:
            items = [with_instruction(instruction, t) for t in items]
        return self.encode(items, parameters), "query" in feeds

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
        """Tokenize under the request's ``overflow_policy`` (see ``TextTokenizer.encode``)."""
        return self.tokenizer.encode(items, string_parameter(parameters, "overflow_policy", "default"))


def texts(feeds: Mapping[str, np.ndarray], name: str) -> list[str]:
    """A BYTES input as text.

    Raises:
        InvalidInput: no items, or an item that is not UTF-8 -> INVALID_ARGUMENT / 400.
    """
    items = feeds[name].reshape(-1)
    if not len(items):
        raise InvalidInput(f"input '{name}' has no items: send at least one text")
    out = []
    for index, item in enumerate(items):
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError:
            raise InvalidInput(f"item {index} of input '{name}' is not valid UTF-8 text") from None
    return out


def string_parameter(parameters: Mapping[str, Parameter], key: str, default: str) -> str:
    """A string request parameter.

    Raises:
        InvalidInput: present with another type -> INVALID_ARGUMENT / 400.
    """
    value = parameters.get(key, default)
    if not isinstance(value, str):
        raise InvalidInput(f"parameter '{key}' must be a string")
    return value


def with_instruction(instruction: str, text: str) -> str:
    """SIE's instruction prefix: ``instruction``, a space unless it ends in whitespace, then the text."""
    if not instruction:
        return text
    return instruction + text if instruction[-1].isspace() else f"{instruction} {text}"


def text_input(name: str, optional: bool = False, shape: tuple[int, ...] = (-1,)) -> OnnxTensor:
    """A BYTES text input of the V2 interface."""
    return OnnxTensor(name, BYTES, shape, optional)


def l2_normalize(array: np.ndarray) -> np.ndarray:
    """Rows (last axis) scaled to unit length; zero rows stay zero. float32 in, float32 out."""
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    return array / np.maximum(norms, 1e-12)


def _file_max_length(path: Path) -> int:
    truncation = json.loads(path.read_text(encoding="utf-8")).get("truncation") or {}
    return int(truncation.get("max_length") or DEFAULT_MAX_LENGTH)
