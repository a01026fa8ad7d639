"""ModelInferRequest -> model feeds (``kserve_v2.request.encode`` builds the ModelInferResponse).

Requests arrive as the wire codec's objects (``kserve_v2.codec``): raw entries are views of the
transport's buffer, and numeric inputs become ``np.frombuffer`` views of them. Request checks
follow Triton's semantics and texts (Triton's ``grpc_service.proto`` and its
``qa/L0_input_validation`` tests); every error is INVALID_ARGUMENT unless noted. Inputs read
from shared memory have no raw entry: raw entries belong, in order, to the other inputs
(Triton's ``infer_handler.cc``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kserve_v2.backend import Parameter
from kserve_v2.codec.messages import Buffer, InferParameter, InferRequest, InputTensor, RequestedOutput
from kserve_v2.protocol.datatypes import BYTES
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.protocol.model_spec import MAX_MEMO, InputPlan, ModelSpec, RequestPlan, TensorSpec
from kserve_v2.protocol.tensors import element_count, from_contents, from_raw, unpack_bytes
from kserve_v2.request import classification
from kserve_v2.request.input_order import triton_input_order
from kserve_v2.request.shared_memory import RegionRange, RequestRegions

_SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_INTEGER_PARAMS = ("int64_param", "uint64_param")
# Triton reserves this prefix and rejects keys it does not know; other parameters are passed over.
_RESERVED_PREFIX = "triton_"
# Reserved keys Triton accepts; perf_analyzer sends this one (it only matters for decoupled models).
_KNOWN_RESERVED = frozenset({"triton_enable_empty_final_response"})


@dataclass(slots=True)
class DecodedRequest:
    """A validated request: model-shaped feeds, outputs to return (and their names), the batch
    size, the request's own (non-reserved) parameters, the shared memory each output goes to (if
    any) and the outputs asked for as classes."""

    feeds: dict[str, np.ndarray]
    outputs: Sequence[TensorSpec]
    batch_size: int
    parameters: dict[str, Parameter]
    output_memory: dict[str, tuple[RegionRange, dict[str, InferParameter]]]  # output -> (range, its shm parameters)
    output_names: Sequence[str] = ()
    classes: dict[str, int] = field(default_factory=dict)  # output -> classification count (``kserve_v2.request.classification``)

    def __post_init__(self) -> None:
        if not self.output_names:
            self.output_names = tuple(t.name for t in self.outputs)

    def keeping(self, names: Sequence[str]) -> DecodedRequest:
        """The request as answered with only the outputs ``names`` (a subset of ``output_names``, in
        their order): the outputs its model did not make are left out (``Execution.names``)."""
        kept = set(names)
        return DecodedRequest(self.feeds, [t for t in self.outputs if t.name in kept], self.batch_size, self.parameters,
                              {k: v for k, v in self.output_memory.items() if k in kept}, tuple(names),
                              {k: v for k, v in self.classes.items() if k in kept})


def decode_request(request: InferRequest, spec: ModelSpec, memory: RequestRegions | None = None) -> DecodedRequest:
    """Validate a request against the model and decode its tensors (numeric raw entries stay in the
    transport's buffer, as read-only ``np.frombuffer`` views).

    ``memory``: the request's view of the registered shared memory regions (each one it names is held
    until the caller releases it), or None when client shared memory is off.

    Raises:
        InvalidInput: unknown, duplicate or missing inputs; datatype or shape mismatch;
            contents and raw both used; raw count differing from the inputs; byte size or
            element count mismatch; unknown or duplicate outputs; reserved parameters.
        InvalidInput: a bad ``classification`` parameter (``classification.requested_count``).
        NotFound: an unregistered shared memory region -> NOT_FOUND.
    """
    parameters: dict[str, Parameter] = {}
    for key, value in request.parameters.items():
        if key.startswith(_RESERVED_PREFIX):
            if key not in _KNOWN_RESERVED:
                raise InvalidInput(f"parameter '{key}' is reserved and not recognised")
        elif value.choice is not None:
            parameters[key] = value.value
    inputs = request.inputs
    entries = request.raw_input_contents
    signature = None
    if len(entries) == len(inputs):
        header = request.header  # requests decoded from the same bytes share it: the signature is kept there
        signature = header.memo
        if signature is None:
            signature = header.memo = _signature(inputs, request.outputs) or ()
        signature = signature or None
    if signature is not None:
        plan = spec.plans.get(signature)
        if plan is not None:
            feeds = _planned_feeds(plan, entries, spec)
            if feeds is not None:
                return DecodedRequest(feeds, plan.outputs, plan.batch_size, parameters, {}, plan.output_names)
    feeds = _decode_inputs(inputs, spec, memory, entries)
    batch_size = _batch_size(feeds, spec)
    for tensor in spec.inputs:
        if tensor.reshape is not None and tensor.name in feeds:
            feeds[tensor.name] = _reshape(feeds[tensor.name], tensor.reshape, spec, tensor.name)
    outputs, output_memory, classes = _requested_outputs(request, spec, memory)
    decoded = DecodedRequest(feeds, outputs, batch_size, parameters, output_memory, classes=classes)
    if signature is not None:
        _remember(spec, signature, inputs, decoded)
    return decoded


def _signature(inputs: list[InputTensor], outputs: list[RequestedOutput]) -> Hashable | None:
    """What validation reads of a request whose tensors all travel in raw entries: each input's
    name, datatype and shape, and the outputs' names. None when a tensor has parameters (shared
    memory, classification) or typed contents: such requests are validated in full every time."""
    described = []
    for sent in inputs:
        if sent.parameters or sent.contents is not None:
            return None
        described.append((sent.name, sent.datatype, tuple(sent.shape)))
    names = []
    for wanted in outputs:
        if wanted.parameters:
            return None
        names.append(wanted.name)
    return tuple(described), tuple(names)


def _planned_feeds(plan: RequestPlan, entries: Sequence[Buffer], spec: ModelSpec) -> dict[str, np.ndarray] | None:
    """The feeds of a request whose signature was validated before; None when a raw entry's size
    differs from what its shape needs (the full validation then gives Triton's error)."""
    feeds: dict[str, np.ndarray] = {}
    for planned, entry in zip(plan.inputs, entries, strict=True):
        if planned.numpy is None:
            try:
                feeds[planned.name] = unpack_bytes(entry, planned.count, f"input '{planned.name}' for model '{spec.name}'"
                                                   ).reshape(planned.shape)
            except InvalidInput:
                return None  # the full validation names the input Triton names
        elif len(entry) != planned.nbytes:
            return None
        else:
            feeds[planned.name] = np.frombuffer(entry, planned.numpy).reshape(planned.shape)
    return feeds


def _remember(spec: ModelSpec, signature: Hashable, inputs: list[InputTensor],
              decoded: DecodedRequest) -> None:
    """Keep what a fully validated request became under its signature (at most ``MAX_MEMO`` per model)."""
    planned = []
    for sent in inputs:
        dtype = spec.inputs_by_name[sent.name].dtype
        array = decoded.feeds[sent.name]
        planned.append(InputPlan(sent.name, None if dtype is BYTES else array.dtype, array.shape, array.size,
                                  array.nbytes))
    if len(spec.plans) >= MAX_MEMO:
        spec.plans.clear()
    spec.plans[signature] = RequestPlan(tuple(planned), tuple(decoded.outputs), tuple(decoded.output_names),
                                        decoded.batch_size)


def _decode_inputs(inputs: list[InputTensor], spec: ModelSpec,
                   memory: RequestRegions | None, raw: Sequence[Buffer]) -> dict[str, np.ndarray]:
    by_name = spec.inputs_by_name
    # (region, offset, byte_size) of each input read from shared memory, None for the others
    in_memory = [_memory_reference(sent.parameters, f"input '{sent.name}'", memory) if sent.parameters else None
                 for sent in inputs]
    raw_count = len(raw)
    for sent, reference in zip(inputs, in_memory, strict=True):  # before any count (Triton's order)
        if sent.contents is not None:
            if reference is not None:
                raise InvalidInput(f"unexpected 'content' provided when using shared memory for input tensor "
                                   f"'{sent.name}' for model '{spec.name}'")
            if raw_count:
                raise InvalidInput(f"contents field must not be specified when using raw_input_contents for "
                                   f"'{sent.name}' for model '{spec.name}'")
    expected = in_memory.count(None)
    if raw_count and raw_count != expected:
        raise InvalidInput(
            f"expected {expected} entries in raw_input_contents (one per input not in shared memory) "
            f"for model '{spec.name}', got {raw_count}"
        )
    raw_index = 0
    feeds: dict[str, np.ndarray] = {}
    for index, (sent, reference) in enumerate(zip(inputs, in_memory, strict=True)):
        name = sent.name
        tensor = by_name.get(name)
        if tensor is None:
            raise InvalidInput(f"unexpected inference input '{name}' for model '{spec.name}'")
        if name in feeds:
            raise InvalidInput(f"input '{name}' appears more than once in the request for model '{spec.name}'")
        entry = None
        if raw_count and (reference is None or memory is None):
            entry = raw[raw_index]
            raw_index += 1
        try:
            feeds[name] = _decode_input(sent, tensor, spec, entry, reference, memory)
        except InvalidInput as failure:
            raise _first_failure(inputs, in_memory, raw, index, failure, spec, memory) from None
    if len(feeds) < len(spec.inputs):
        _check_required(spec, feeds)
    return feeds


def _decode_input(sent: InputTensor, tensor: TensorSpec, spec: ModelSpec, entry: Buffer | None,
                  reference: tuple[str, int, int] | None, memory: RequestRegions | None) -> np.ndarray:
    """One input's array, from shared memory (``reference``), its raw entry or its typed contents,
    after its datatype and shape checks (Triton's per-input checks in ``InferenceRequest::Normalize``)."""
    name = sent.name
    if sent.datatype != tensor.dtype.v2:
        raise InvalidInput(f"inference input '{name}' data-type is '{sent.datatype}', "
                           f"but model '{spec.name}' expects '{tensor.dtype.v2}'")
    shape = sent.shape
    spec.check_shape(tensor, shape)
    what = f"input '{name}' for model '{spec.name}'"
    if reference is not None and memory is not None:
        return from_raw(memory.slice(*reference).read(), tensor.dtype, shape, what)
    if entry is not None:
        return from_raw(entry, tensor.dtype, shape, what)
    return _from_typed_contents(sent, tensor, shape, what)


def _first_failure(inputs: list[InputTensor], in_memory: list[tuple[str, int, int] | None], raw: Sequence[Buffer],
                   failed: int, failure: InvalidInput, spec: ModelSpec, memory: RequestRegions | None) -> InvalidInput:
    """The error Triton gives when input ``failed`` (an index in ``inputs``) failed its checks with
    ``failure``: Triton checks the inputs in the order of its core's ``std::unordered_map`` of them
    (``triton_input_order``), so another input that fails too may come first. The inputs before
    ``failed`` passed; an unknown or repeated input after it fails before any input's checks, as in
    Triton (its name is looked up, and a repeat refused, before the per-input checks)."""
    names = {sent.name for sent in inputs[:failed + 1]}
    for sent in inputs[failed + 1:]:
        if sent.name not in spec.inputs_by_name:
            return InvalidInput(f"unexpected inference input '{sent.name}' for model '{spec.name}'")
        if sent.name in names:
            return InvalidInput(f"input '{sent.name}' appears more than once in the request for model '{spec.name}'")
        names.add(sent.name)
    errors: dict[int, InvalidInput] = {failed: failure}
    raw_index = sum(1 for reference in in_memory[:failed + 1] if reference is None or memory is None) if raw else 0
    for index in range(failed + 1, len(inputs)):
        sent, reference = inputs[index], in_memory[index]
        entry = None
        if raw and (reference is None or memory is None):
            entry = raw[raw_index]
            raw_index += 1
        try:
            _decode_input(sent, spec.inputs_by_name[sent.name], spec, entry, reference, memory)
        except InvalidInput as err:
            errors[index] = err
    for index in triton_input_order([sent.name for sent in inputs]):
        if index in errors:
            return errors[index]
    return failure  # not reached: ``failed`` is in the order


def _check_required(spec: ModelSpec, feeds: Mapping[str, np.ndarray]) -> None:
    """Every input not marked optional must be in the request.

    Raises:
        InvalidInput: Triton's text (``infer_request.cc`` ``ValidateRequestInputs``): "expected <n>
            inputs but got <k> inputs for model '<m>'. Got input(s) ['a','b'], but missing required
            input(s) ['c']. Please provide all required input(s)." - with "expected number of inputs
            between <required> and <n>" when the model has optional inputs.
    """
    missing = [t.name for t in spec.inputs if t.name not in feeds and not t.optional]
    if not missing:
        return
    required = sum(not t.optional for t in spec.inputs)
    expected = (f"expected {len(spec.inputs)} inputs" if required == len(spec.inputs)
                else f"expected number of inputs between {required} and {len(spec.inputs)}")
    raise InvalidInput(f"{expected} but got {len(feeds)} inputs for model '{spec.name}'. Got input(s) "
                       f"{_name_list(feeds)}, but missing required input(s) {_name_list(missing)}. "
                       "Please provide all required input(s).")


def _name_list(names: Iterable[str]) -> str:
    """Names as Triton lists them in its texts: ``['a','b']`` (no spaces)."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _from_typed_contents(sent: InputTensor, tensor: TensorSpec, shape: list[int], what: str) -> np.ndarray:
    field = tensor.dtype.contents_field
    given = sent.contents.fields if sent.contents is not None else {}
    if field is None:
        raise InvalidInput(f"{tensor.dtype.v2} data of {what} must be sent in raw_input_contents")
    if sent.contents is None and element_count(shape, what):
        raise InvalidInput(f"{what} has no data: send it in raw_input_contents or contents.{field}")
    if any(name != field for name in given):
        raise InvalidInput(f"{tensor.dtype.v2} data of {what} goes in contents.{field}, not {', '.join(given)}")
    return from_contents(given.get(field, ()), tensor.dtype, shape, what)


def _batch_size(feeds: dict[str, np.ndarray], spec: ModelSpec) -> int:
    if spec.max_batch_size == 0:
        return 1
    sizes = {array.shape[0] for array in feeds.values()}
    if len(sizes) > 1:
        by_name = {name: array.shape[0] for name, array in feeds.items()}
        raise InvalidInput(f"inputs of one request for model '{spec.name}' have different batch sizes: {by_name}")
    return sizes.pop() if sizes else 0


def _reshape(array: np.ndarray, reshape: tuple[int, ...], spec: ModelSpec, name: str) -> np.ndarray:
    target = ([array.shape[0]] if spec.max_batch_size > 0 else []) + list(reshape)
    try:
        return array.reshape(target)
    except ValueError:
        raise InvalidInput(f"input '{name}' of shape {list(array.shape)} cannot take the model's reshape {list(reshape)}") from None


def _memory_reference(parameters: Mapping[str, InferParameter], what: str, memory: RequestRegions | None
                      ) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) named by a tensor's ``shared_memory_*`` parameters, or None.

    Raises:
        InvalidInput: shared memory named while it is off, or parameters of the wrong type or missing.
    """
    if not parameters or not any(key in parameters for key in _SHM_PARAMETERS):
        return None
    if memory is None:
        raise InvalidInput(f"{what} names a shared memory region, but client shared memory is disabled")
    values = {}
    for key, kinds in zip(_SHM_PARAMETERS, (("string_param",), _INTEGER_PARAMS, _INTEGER_PARAMS), strict=True):
        if key in parameters:
            if parameters[key].choice not in kinds:
                raise InvalidInput(f"parameter '{key}' of {what} has the wrong type")
            values[key] = parameters[key].value
    if "shared_memory_region" not in values or "shared_memory_byte_size" not in values:
        raise InvalidInput(f"{what} needs both 'shared_memory_region' and 'shared_memory_byte_size'")
    return (str(values["shared_memory_region"]), int(values.get("shared_memory_offset", 0)),
            int(values["shared_memory_byte_size"]))


def _requested_outputs(request: InferRequest, spec: ModelSpec, memory: RequestRegions | None
                       ) -> tuple[list[TensorSpec], dict[str, tuple[RegionRange, dict[str, InferParameter]]],
                                  dict[str, int]]:
    """The outputs to return, those written to shared memory (with the parameters that named the
    range, which the response repeats), and those asked for as classes."""
    placed: dict[str, tuple[RegionRange, dict[str, InferParameter]]] = {}
    classes: dict[str, int] = {}
    requested = request.outputs
    if not requested:
        return list(spec.outputs), placed, classes
    by_name = spec.outputs_by_name
    chosen: list[TensorSpec] = []
    names: set[str] = set()
    for wanted in requested:
        name = wanted.name
        tensor = by_name.get(name)
        if tensor is None:
            raise InvalidInput(f"unexpected inference output '{name}' for model '{spec.name}'")
        if name in names:
            raise InvalidInput(f"output '{name}' is requested more than once for model '{spec.name}'")
        if wanted.parameters:
            if classification.PARAMETER in wanted.parameters:
                in_memory = any(key in wanted.parameters for key in _SHM_PARAMETERS)
                classes[name] = classification.requested_count(wanted.parameters[classification.PARAMETER],
                                                               tensor.dtype.v2, in_memory)
            reference = _memory_reference(wanted.parameters, f"output '{name}'", memory)
            if reference is not None and memory is not None:
                placed[name] = (memory.slice(*reference),
                                {key: wanted.parameters[key] for key in _SHM_PARAMETERS if key in wanted.parameters})
        chosen.append(tensor)
        names.add(name)
    return chosen, placed, classes
