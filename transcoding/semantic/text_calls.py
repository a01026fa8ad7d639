"""The semantic routes' side of a text model's contract (``kserve_v2.backend.text``): one call per request,
and SIE's ModelInfo of a text model.

A route builds a ``Call`` with the texts and the output kinds its body asks for and hands it to
``TextModels.infer`` (``kserve_v2.service.text_models``), which resolves the model, gives the call the model's contract to
check the request against and to name the V2 tensors, and runs it: one service call per request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from kserve_v2.backend.text import NOT_TEXT, InputKind, OutputKind, TextContract, TextModelInfo, TextOutput, TextRequest
from kserve_v2.protocol.errors import InvalidInput

# how a refusal reads: SIE's encode says "produce", the other routes "support"
SUPPORT = "model '{name}' does not support '{kind}' (it supports: {offered})"
PRODUCE = "model '{name}' does not produce '{kind}' outputs (it produces: {offered})"


@dataclass(eq=False)
class Call:
    """One semantic request as a ``kserve_v2.backend.text.TextCall``.

    Attributes:
        http: the HTTP request (its ``state.model`` gets the resolved name, for errors and metrics).
        texts: the texts of each input.
        wanted: the output kinds to return, each with its dtype (None: the kind's default).
        parameters: V2 string request parameters.
        refusal: the message of a kind the model does not give (``SUPPORT`` or ``PRODUCE``).
        check: a route's own check of the request against the contract (name, contract), run
            after the kinds are checked.
        name, contract, outputs: what the service resolved: the repository name, the contract,
            and the ``TextOutput`` chosen for each wanted kind.
    """

    http: Request
    texts: dict[InputKind, Sequence[str]]
    wanted: Sequence[tuple[OutputKind, str | None]]
    parameters: dict[str, str] = field(default_factory=dict)
    refusal: str = SUPPORT
    check: Callable[[str, TextContract], None] | None = None
    name: str = ""
    contract: TextContract = NOT_TEXT
    outputs: dict[OutputKind, TextOutput] = field(default_factory=dict)

    @classmethod
    def score(cls, http: Request, query: str, items: Sequence[str], parameters: dict[str, str],
              check: Callable[[str, TextContract], None] | None = None) -> Call:
        """Each item's relevance to ``query``: the one call behind SIE's ``/v1/score`` and the rerank routes."""
        return cls(http, {InputKind.QUERY: [query], InputKind.TEXT: items}, [(OutputKind.SCORE, None)], parameters,
                   check=check)

    def resolved(self, name: str) -> None:
        """Remember the repository name, and label the request with it."""
        self.name = self.http.state.model = name

    def plan(self, name: str, contract: TextContract) -> TextRequest:
        """The V2 tensors of the wanted kinds, from the contract.

        Raises:
            InvalidInput: a kind, or a dtype of it, the model does not give -> 400 INVALID_INPUT.
        """
        self.contract = contract
        offered = contract.kinds()
        for kind, _ in self.wanted:
            if kind not in offered:
                listed = [k for k in offered if k is not OutputKind.TOKENS]  # SIE's output types only
                raise InvalidInput(self.refusal.format(name=name, kind=kind.value, offered=", ".join(listed) or "none"))
        if self.check is not None:
            self.check(name, contract)
        for kind, dtype in self.wanted:
            output = contract.output(kind, dtype)
            if output is None:
                raise InvalidInput(f"model '{name}' does not give '{kind.value}' outputs as {dtype}")
            self.outputs[kind] = output
        return TextRequest(self.texts, [t for o in self.outputs.values() for t in o.tensors], self.parameters)


def truncation(truncate: bool | str | None, direction: str | None = None) -> dict[str, str]:
    """The V2 request parameters of a ``truncate`` field (Cohere's ``NONE``/``START``/``END``, TEI's
    boolean) and TEI's ``truncation_direction`` (``Right``/``Left``); empty when ``truncate`` is None
    (the route's default applies)."""
    if truncate is None:
        return {}
    value = str(truncate).lower()
    if value in ("false", "none"):
        return {"overflow_policy": "error"}
    left = value == "start" or (value == "true" and (direction or "").lower() == "left")
    return {"overflow_policy": "truncate_text", "truncation_direction": "left" if left else "right"}


def prompt_parameters(instruction: str | None, prompt_name: str | None) -> dict[str, str]:
    """The V2 request parameters of SIE's ``instruction`` (an empty one is none) and of
    ``prompt_name``: the text backend puts the instruction, then a space unless it ends in white
    space, ahead of the model's ``document_prefix`` (or ``query_prefix``, as ``prompt_name`` chooses)
    and the text. Every route that takes them (``/v1/encode``, ``/v1/embeddings``) reads them here."""
    parameters = {}
    if instruction:
        parameters["instruction"] = instruction
    if prompt_name is not None:
        parameters["prompt_name"] = prompt_name
    return parameters


def model_info(info: TextModelInfo) -> dict[str, Any]:
    """SIE's ModelInfo (SIE's HTTP API reference, ``GET /v1/models``): a loaded model's dims from
    its contract; a model that is not loaded shows its backend's outputs and ``dims: {}``."""
    contract = info.contract
    dims: dict[str, int] = {}
    if contract is not None:
        dims = {kind.value: contract.width(kind) for kind in (OutputKind.DENSE, OutputKind.MULTIVECTOR, OutputKind.SPARSE)
                if kind in info.kinds}
    outputs = [kind.value for kind in info.kinds if kind is not OutputKind.TOKENS]  # SIE's output types only
    content: dict[str, Any] = {"name": info.name, "inputs": ["text"], "outputs": outputs,
                               "dims": dims, "loaded": contract is not None,
                               "max_sequence_length": info.max_sequence_length, "profiles": {}}
    if info.aliases:
        content["aliases"] = list(info.aliases)
    return content
