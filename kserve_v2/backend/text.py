"""The typed contract of a text model: what it takes and gives, declared once by its backend.

A text backend (``adapters/``, or any ``kserve_v2.backends`` entry point) opens an executable whose
``text`` attribute is a ``TextContract``; the semantic routes (SIE's encode, score and extract,
OpenAI's embeddings and models) read that object, through the service, to learn which outputs a
model gives, their widths and dtypes, and its tokenizer limit. Output kinds are SIE's output types
(SIE's HTTP API reference, ``output_types``); dtypes are SIE's ``output_dtype`` names. The V2
tensors each kind travels in are named by the contract, so the routes never guess a tensor name.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class InputKind(enum.StrEnum):
    """A BYTES text input of a text model (its V2 input of the same name)."""

    TEXT = "text"  # the items: one text each, [-1]
    QUERY = "query"  # one query the items are scored against, [1]
    LABELS = "labels"  # entity types to keep, [-1]


class OutputKind(enum.StrEnum):
    """What a text model gives per item, as SIE names its output types (declaration order = listing order)."""

    DENSE = "dense"
    SPARSE = "sparse"
    MULTIVECTOR = "multivector"
    SCORE = "score"
    ENTITIES = "entities"
    TOKENS = "tokens"  # the tokenizer's view of each item (every text model gives it; not one of SIE's types)


@dataclass(frozen=True, slots=True)
class TextInput:
    """One BYTES input of a text model, in the order of its V2 interface.

    Attributes:
        kind: which input (its V2 name): ``query`` is [1], the others [-1].
        optional: whether a request may leave it out.
    """

    kind: InputKind
    optional: bool = False


@dataclass(frozen=True, slots=True)
class TextOutput:
    """One output kind in one dtype, and the V2 output tensors that carry it.

    Attributes:
        kind: the output kind.
        dtype: SIE's element type: ``float32``, ``float16``, ``int8``, ``binary`` (sign bits
            packed 8 to a byte), ``json`` (a UTF-8 JSON document per item), or ``int64``.
        width: components of one vector (the embedding dims, the vocabulary size of a sparse
            vector); 0 for one value or document per item.
        values: the V2 output with the values: [items, width] for a fixed-width vector per item,
            [rows] or [rows, width] item after item when ``lengths`` is set, [items] otherwise.
        lengths: the V2 output (INT64 [items]) giving each item's rows of a ragged ``values``.
        indices: the V2 output (INT64 [rows]) with the vocabulary index of each sparse value.
    """

    kind: OutputKind
    dtype: str
    width: int
    values: str
    lengths: str | None = None
    indices: str | None = None

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every V2 output to ask for: indices, values, lengths (those that are set)."""
        return tuple(name for name in (self.indices, self.values, self.lengths) if name is not None)


@dataclass(frozen=True, slots=True)
class TextContract:
    """What a text model takes and gives.

    Attributes:
        inputs: its BYTES inputs in V2 order; ``TEXT`` always, ``QUERY`` to score items against a query.
        outputs: every output it gives, in V2 order, each kind once per dtype (the first of a
            kind is its default dtype).
        max_sequence_length: tokens per item its tokenizer keeps (special tokens included).
    """

    inputs: tuple[TextInput, ...]
    outputs: tuple[TextOutput, ...]
    max_sequence_length: int

    def takes(self, kind: InputKind) -> bool:
        """Whether it has input ``kind``."""
        return any(i.kind == kind for i in self.inputs)

    def kinds(self) -> list[OutputKind]:
        """The output kinds it gives, in ``OutputKind`` order."""
        given = {output.kind for output in self.outputs}
        return [kind for kind in OutputKind if kind in given]

    def output(self, kind: OutputKind, dtype: str | None = None) -> TextOutput | None:
        """The output of ``kind`` in ``dtype`` (None: its default dtype); None when it has none."""
        return next((o for o in self.outputs if o.kind == kind and dtype in (None, o.dtype)), None)

    def width(self, kind: OutputKind) -> int:
        """The width of ``kind``'s default output; 0 when it has none."""
        output = self.output(kind)
        return 0 if output is None else output.width


# the contract of a model that is not a text model: it takes and gives nothing as one
NOT_TEXT = TextContract((), (), 0)


@dataclass(frozen=True, slots=True)
class TextRequest:
    """One execution of a text model, in terms of its contract.

    Attributes:
        texts: V2 input name (an ``InputKind``) -> its texts (a BYTES [n] input each).
        outputs: the V2 outputs to return (names from the contract's ``TextOutput.tensors``).
        parameters: request parameters, as V2 string parameters (``overflow_policy``, ``instruction``, ...).
    """

    texts: dict[InputKind, Sequence[str]]
    outputs: Sequence[str]
    parameters: dict[str, str] = field(default_factory=dict)


class TextCall(Protocol):
    """What a semantic route tells the service about one request (``TextModels.infer``, ``kserve_v2.service.text_models``)."""

    def resolved(self, name: str) -> None:
        """The model's repository name is known (called first, before any model check)."""

    def plan(self, name: str, contract: TextContract) -> TextRequest:
        """The execution to run on the model ``name`` with ``contract`` (raise to refuse it)."""
        ...


@dataclass(frozen=True, slots=True)
class TextModelInfo:
    """A repository model seen as a text model, loaded or not.

    Attributes:
        name: its repository name.
        aliases: other names it answers to (its config's ``alias`` parameter).
        kinds: the output kinds it gives (a loaded model's contract, else its backend's declaration);
            empty: it is not a text model.
        contract: the READY version's contract; None while no version is READY.
        max_sequence_length: the contract's, else its configuration's ``max_sequence_length``
            parameter (0 when it has none).
    """

    name: str
    aliases: tuple[str, ...]
    kinds: tuple[OutputKind, ...]
    contract: TextContract | None
    max_sequence_length: int
