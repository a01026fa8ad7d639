"""Ragged batching, as Triton has it (``ragged_batching.md``, ``model_configuration.md``; the
batch inputs and outputs of ``model_config.proto``): requests whose inputs differ in shape merge
into one execution without padding.

- ``allow_ragged_batch`` on an input: requests batch together whatever that input's shape; the
  model takes it as one 1-D tensor, the requests' elements concatenated in batch order (Triton's
  onnxruntime backend: the model's input has shape ``[-1]``).
- ``batch_input``: tensors the server builds for each execution, once the batch is formed, and
  feeds the model under each ``target_name`` (requests never send them), from the shapes of the
  ``source_input`` in each request (Triton's ``BackendInputCollector``), as ``data_type``
  (``TYPE_INT32`` or ``TYPE_FP32``): ``BATCH_ELEMENT_COUNT`` ``[requests]`` (each request's element
  count), ``BATCH_ACCUMULATED_ELEMENT_COUNT`` ``[requests]`` (their running sum: where each request
  ends), ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO`` ``[requests + 1]`` (the same after a 0),
  ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE`` ``[the largest element count]`` (only its shape says
  something; zeros here), ``BATCH_ITEM_SHAPE`` ``[rows, rank - 1]`` (each batch row's shape without
  the batch dim) and ``BATCH_ITEM_SHAPE_FLATTEN`` (the same, 1-D).
- ``batch_output`` ``BATCH_SCATTER_WITH_INPUT_SHAPE``: the output is one tensor for the whole batch,
  cut in batch order into one piece per request, of the output's configured shape (batch dim
  first) with each -1 taken from the request's ``source_input`` shape at the same position
  (Triton's ``BackendOutputResponder::ProcessBatchOutput``). Other outputs are split along the
  batch dim as without ragged batching.

``wrap`` gives a model with any of these a ``RaggedModel``: it does this for one request as for a
batch of the dynamic batcher (``RaggedBatching``, its ``BatchStrategy``).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import NO_CONTEXT, BatchStrategy, Executable, Execution, Parameter, RequestContext, TextContract
from kserve_v2.protocol.errors import InternalError
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.scheduling.batch_rows import key_parameters, split_rows

Feeds = dict[str, np.ndarray]
_KIND = mc.BatchInput.Kind
_NUMPY = {mc.TYPE_INT32: np.dtype(np.int32), mc.TYPE_FP32: np.dtype(np.float32)}


def is_ragged(config: mc.ModelConfig) -> bool:
    """Whether the configuration asks for ragged batching: a ragged input, a batch input or a batch output."""
    return bool(config.batch_input or config.batch_output or any(i.allow_ragged_batch for i in config.input))


def batch_input_names(config: mc.ModelConfig) -> set[str]:
    """The model inputs the server feeds itself (every batch input's ``target_name``): requests do not send
    them and auto-complete does not add them to ``input``."""
    return {name for batch_input in config.batch_input for name in batch_input.target_name}


def config_problem(config: mc.ModelConfig, inputs: Sequence[TensorDeclaration]) -> str | None:
    """What Triton refuses to load in a configuration's ragged batching (its core's ``ValidateBatchIO`` and
    onnxruntime backend's input checks, their texts); None when it is fine. ``inputs``: the model's own
    inputs (the ONNX graph's), or empty where the backend declares none (their checks are then skipped).
    The caller fails the load with it."""
    input_names = {i.name for i in config.input}
    output_names = {o.name for o in config.output}
    for batch_input in config.batch_input:
        kind = _KIND.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(batch_input.source_input)}"
        if batch_input.data_type not in _NUMPY:
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        unknown = [name for name in batch_input.source_input if name not in input_names]
        if unknown:
            return f"unknown source input name '{unknown[0]}'"
    for batch_output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(batch_output.source_input)}"
        unknown = [name for name in batch_output.source_input if name not in input_names]
        if unknown:
            return f"unknown source input name '{unknown[0]}'"
        targets: set[str] = set()
        for name in batch_output.target_name:
            if name not in output_names:
                return f"unknown target output name '{name}'"
            if name in targets:
                return f"target output name '{name}' can only be specified once"
            targets.add(name)
    graph = {t.name: t for t in inputs}
    for tensor in config.input:
        found = graph.get(tensor.name)
        if not tensor.allow_ragged_batch or found is None:
            continue
        if tensor.optional:
            return (f"unable to load model '{config.name}', configuration expects model provides input with shape "
                    f"[-1] for ragged input '{tensor.name}', which is not supported for optional input")
        if found.shape != (-1,):
            return (f"unable to load model '{config.name}', configuration expects model provides input with shape "
                    f"[-1]  for ragged input '{tensor.name}', model provides [{','.join(map(str, found.shape))}]")
    for batch_input in config.batch_input:
        for name in batch_input.target_name:
            target = graph.get(name)
            if inputs and target is None:
                return f"batch input '{name}' is not an input of the model: it has {', '.join(sorted(graph))}"
            if target is not None and mc.DataType.Name(batch_input.data_type) != target.dtype.config:
                return (f"unable to load model '{config.name}', configuration expects datatype "
                        f"{mc.DataType.Name(batch_input.data_type)} for batch input '{name}', model provides "
                        f"TYPE_{target.dtype.v2}")
    return None


def batch_input_tensor(batch_input: mc.BatchInput, shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    """One batch input for a batch whose requests gave its ``source_input`` with ``shapes`` (batch dim
    first, in batch order); the kinds as the module docstring lists them. INT32 or FP32, as ``data_type``."""
    dtype = _NUMPY[batch_input.data_type]
    counts = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    kind = batch_input.kind
    if kind == _KIND.BATCH_ELEMENT_COUNT:
        return np.array(counts, dtype=dtype)
    if kind == _KIND.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.array(list(itertools.accumulate(counts)), dtype=dtype)
    if kind == _KIND.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.array([0, *itertools.accumulate(counts)], dtype=dtype)
    if kind == _KIND.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(max(counts, default=0), dtype=dtype)
    rank = max((len(shape) - 1 for shape in shapes), default=0)
    rows = [shape[1:] for shape in shapes for _ in range(shape[0] if shape else 0)]
    items = np.array(rows, dtype=dtype).reshape(len(rows), rank)
    if kind == _KIND.BATCH_ITEM_SHAPE:
        return items
    if kind == _KIND.BATCH_ITEM_SHAPE_FLATTEN:
        return items.reshape(-1)
    raise InternalError(f"unknown batch input kind {kind}")


def merge_ragged(config: mc.ModelConfig, members: Sequence[Feeds]) -> Feeds:
    """The feeds of one execution: ragged inputs flattened and concatenated (1-D), the others
    concatenated along the batch dim, and every batch input under each of its target names."""
    ragged = {i.name for i in config.input if i.allow_ragged_batch}
    merged: Feeds = {}
    for name in members[0]:
        parts = [m[name].reshape(-1) if name in ragged else m[name] for m in members]
        merged[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    for batch_input in config.batch_input:
        source = batch_input.source_input[0]
        tensor = batch_input_tensor(batch_input, [m[source].shape for m in members if source in m])
        for name in batch_input.target_name:
            merged[name] = tensor
    return merged


def scatter_shapes(config: mc.ModelConfig, output: str, sources: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each request's piece of ``BATCH_SCATTER_WITH_INPUT_SHAPE`` output ``output``: its configured shape
    (reshape, else dims) after a -1 batch dim (with ``max_batch_size > 0``), each -1 the source input's dim
    at that position.

    Raises:
        InternalError: a -1 where the source input has no dim."""
    tensor = next(o for o in config.output if o.name == output)
    shape = [-1] * (config.max_batch_size > 0) + list(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)
    pieces = []
    for source in sources:
        if any(d == -1 and i >= len(source) for i, d in enumerate(shape)):
            raise InternalError(f"batch output '{output}' has more dims than its source input {list(source)}")
        pieces.append(tuple(source[i] if d == -1 else d for i, d in enumerate(shape)))
    return pieces


def split_ragged(config: mc.ModelConfig, execution: Execution, output_names: Sequence[str],
                 members: Sequence[Feeds]) -> list[Execution]:
    """The batch's execution cut into the members' shares: batch outputs scattered in the shapes of their
    source input, the other outputs along the batch dim (``split_rows``; the first share counts the execution).

    Raises:
        InternalError: a batch output with fewer elements than its pieces, or another output without
            the batch's rows.
    """
    scatter = {name: b.source_input[0] for b in config.batch_output for name in b.target_name}
    sizes = [len(next(iter(m.values()))) for m in members] if len(members) > 1 else [0]
    plain = [i for i, name in enumerate(output_names) if name not in scatter]
    rows = split_rows(Execution([execution.outputs[i] for i in plain], execution.pre_ns, execution.post_ns,
                                execution.tokens), sizes)
    shares = [[np.empty(0)] * len(output_names) for _ in members]
    for share, part in zip(shares, rows, strict=True):
        for i, array in zip(plain, part.outputs, strict=True):
            share[i] = array
    for i, name in enumerate(output_names):
        if name not in scatter:
            continue
        flat = execution.outputs[i].reshape(-1)
        shapes = scatter_shapes(config, name, [m[scatter[name]].shape for m in members])
        bounds = list(itertools.accumulate(int(np.prod(s, dtype=np.int64)) for s in shapes))
        if bounds and bounds[-1] > flat.size:
            raise InternalError(f"batch output '{name}' has {flat.size} elements, the batch's requests need {bounds[-1]}")
        for share, start, end, shape in zip(shares, [0, *bounds], bounds, shapes, strict=False):
            share[i] = flat[start:end].reshape(shape)
    return [Execution(share, part.pre_ns, part.post_ns, part.tokens, part.executions)
            for share, part in zip(shares, rows, strict=True)]


class RaggedBatching:
    """The dynamic batcher's ``BatchStrategy`` for a ragged model: requests whose ragged inputs differ in
    shape share a batch; merged and split as the module docstring says."""

    inline = True

    def __init__(self, model: RaggedModel) -> None:
        self._model = model

    def limit(self, config: mc.ModelConfig) -> int:
        """``max_batch_size`` rows."""
        return config.max_batch_size

    def items(self, feeds: Feeds, batch_size: int) -> int:
        """The request's rows (its batch size)."""
        return batch_size

    def key(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter]) -> Hashable:
        """Same outputs, parameters (``batch_rows.key_parameters``), input datatypes and non-batch shapes
        of the inputs that are not ragged."""
        ragged = self._model.ragged
        return (tuple(output_names), key_parameters(parameters),
                tuple((name, a.dtype.str, None if name in ragged else a.shape[1:]) for name, a in sorted(feeds.items())))

    def execute_batch(self, members: list[Feeds], output_names: Sequence[str], parameters: Mapping[str, Parameter],
                      contexts: Sequence[RequestContext] = ()) -> list[Execution | Exception]:
        """Merge, execute once, split (``RaggedModel.run``)."""
        return list(self._model.run(members, output_names, parameters))


class RaggedModel:
    """A tensor model with ragged batching (an ``Executable`` around the backend's): each execution, of one
    request or of a batch, gets its ragged inputs flattened and its batch inputs, and has its batch outputs
    scattered (see the module docstring)."""

    def __init__(self, config: mc.ModelConfig, executable: Executable) -> None:
        self._config = config
        self._executable = executable
        self.ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
        self.inputs: tuple[TensorDeclaration, ...] = executable.inputs
        self.outputs: tuple[TensorDeclaration, ...] = executable.outputs
        self.on_cuda = executable.on_cuda
        self.batchable = executable.batchable
        self.threaded = executable.threaded
        self._batching = RaggedBatching(self)

    @property
    def batching(self) -> BatchStrategy:
        """``RaggedBatching``."""
        return self._batching

    @property
    def text(self) -> TextContract | None:
        """None: a tensor model."""
        return None

    def run(self, members: Sequence[Feeds], output_names: Sequence[str],
            parameters: Mapping[str, Parameter]) -> list[Execution]:
        """Execute the members as one batch (blocking); one execution per member.

        Raises:
            InternalError: outputs that cannot be split among the members; whatever the backend raises.
        """
        execution = self._executable.execute(merge_ragged(self._config, members), output_names, parameters)
        return split_ragged(self._config, execution, output_names, members)

    def execute(self, feeds: Feeds, output_names: Sequence[str], parameters: Mapping[str, Parameter],
                context: RequestContext = NO_CONTEXT) -> Execution:
        """One request as a batch of one (blocking)."""
        return self.run([feeds], output_names, parameters)[0]

    def close(self) -> None:
        """Close the backend's executable."""
        self._executable.close()


def wrap(config: mc.ModelConfig, executable: Executable) -> Executable:
    """``executable`` as a ``RaggedModel`` when the configuration asks for ragged batching (``is_ragged``) and it
    is a tensor model batched by rows (ONNX Runtime's; not a backend with a ``BatchStrategy`` of its own, as
    the python backend, whose model gets the requests one by one as Triton's python backend gives them); else
    itself."""
    if not is_ragged(config) or executable.text is not None or executable.batching is not None:
        return executable
    return RaggedModel(config, executable)
