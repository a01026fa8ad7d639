"""The semantic routes' side of the service: text models, named as the routes name them, with the
typed contract their backends declare (``kserve_v2.backend.text``). SIE's and OpenAI's routes list them,
describe one, and run one call each through the same inference path as a V2 request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Protocol

import numpy as np

from kserve_v2 import backend
from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.text import NOT_TEXT, OutputKind, TextCall, TextContract, TextModelInfo, TextRequest
from kserve_v2.codec.messages import InferResponse
from kserve_v2.models.lifecycle import ModelLifecycle
from kserve_v2.models.version import ModelVersion
from kserve_v2.observability.metrics import V2_API
from kserve_v2.protocol.datatypes import BYTES
from kserve_v2.protocol.errors import NotFound, NotLoaded, ServerError
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.protocol.tensors import pack_bytes


class RunVersion(Protocol):
    """The service's inference call on a version the caller holds (``InferenceService.run_version``)."""

    def __call__(self, model: ModelVersion, request: pb.ModelInferRequest, carrier: Mapping[str, str] | None = None,
                 api: str = V2_API, *, raw_outputs: bool = True) -> Awaitable[tuple[InferResponse, RequestReport]]:
        ...


class TextModels:
    """Every text model of the repository, for the semantic routes.

    Args:
        manager: the model lifecycle (the repository's ``ModelManager``).
        run: the inference call a planned request runs through.
    """

    def __init__(self, manager: ModelLifecycle, run: RunVersion) -> None:
        self._manager = manager
        self._run = run

    def models(self) -> list[TextModelInfo]:
        """Every text model of the repository, loaded or not, by name."""
        names = dict.fromkeys(row.name for row in self._manager.index(False))
        return [info for info in map(self._info, names) if info.kinds]

    def model(self, name: str) -> TextModelInfo:
        """The model named ``name`` (its repository name or its ``alias``), loaded or not, as a
        text model (no ``kinds`` when it is not one).

        Raises:
            NotFound: no such model -> NOT_FOUND / 404.
        """
        return self._info(self._name(name))

    async def infer(self, name: str, call: TextCall, carrier: Mapping[str, str] | None = None,
                    api: str = V2_API) -> tuple[dict[str, np.ndarray], RequestReport]:
        """One execution of a text model, planned by the route from the model's contract: the name
        resolved (``call.resolved``), its newest READY version taken and held, the request built
        from that version's contract (``call.plan``) and run on that same version as a V2 request
        runs (so a reload in between cannot pair one version's contract with another's execution).

        Returns:
            (V2 output name -> array, for the requested outputs; the report).

        Raises:
            NotFound: no model by that name or alias -> NOT_FOUND / 404.
            NotLoaded: no READY version -> UNAVAILABLE / 503 (SIE's MODEL_NOT_LOADED).
            Whatever ``call.plan`` and ``InferenceService.model_infer_reported`` raise.
        """
        resolved = self._name(name)
        call.resolved(resolved)
        try:
            model = self._manager.acquire_version(resolved, "")
        except NotFound as err:
            raise NotLoaded(f"Model '{resolved}' is not loaded: {err}") from None
        try:
            return await self._infer(model, call.plan(resolved, model.text or NOT_TEXT), carrier, api)
        finally:
            model.release()

    async def _infer(self, model: ModelVersion, planned: TextRequest, carrier: Mapping[str, str] | None, api: str
                     ) -> tuple[dict[str, np.ndarray], RequestReport]:
        """Run a planned text request on ``model`` (held by the caller)."""
        resolved = model.name
        message = pb.ModelInferRequest(model_name=resolved)
        for kind, values in planned.texts.items():
            message.inputs.add(name=kind.value, datatype=BYTES.v2, shape=[len(values)])
            message.raw_input_contents.append(pack_bytes(np.array(values, dtype=object)))
        for output in planned.outputs:
            message.outputs.add(name=output)
        for key, value in planned.parameters.items():
            message.parameters[key].string_param = value
        response, report = await self._run(model, message, carrier, api, raw_outputs=False)
        return {tensor.name: array for tensor, array in zip(response.outputs, report.outputs, strict=True)}, report

    def _name(self, name: str) -> str:
        """The repository name of ``name``: itself, or the model whose ``alias`` parameter it is.

        Raises:
            NotFound: "Model '<name>' not found" -> NOT_FOUND / 404.
        """
        if self._manager.knows(name) or self._manager.stored_config(name) is not None:
            return name
        for stored, config in self._manager.stored_configs():
            if "alias" in config.parameters and config.parameters["alias"].string_value == name:
                return stored
        raise NotFound(f"Model '{name}' not found")

    def _info(self, name: str) -> TextModelInfo:
        """A repository model as a text model: a READY version's contract, else what its backend
        declares (no ``kinds`` when it is not a text model)."""
        config = self._manager.stored_config(name)
        try:
            contract: TextContract | None = self._manager.resolve(name, "").text or NOT_TEXT
        except ServerError:
            contract = None
        kinds: tuple[OutputKind, ...] = ()
        if contract is not None:
            kinds = tuple(contract.kinds())
        elif config is not None and (found := backend.find(config.backend)) is not None:
            kinds = found.offers
        parameters = config.parameters if config is not None else {}
        aliases = (parameters["alias"].string_value,) if "alias" in parameters else ()
        length = (contract.max_sequence_length if contract is not None else
                  int(parameters["max_sequence_length"].string_value or 0) if "max_sequence_length" in parameters else 0)
        return TextModelInfo(name, aliases, kinds, contract, length)
