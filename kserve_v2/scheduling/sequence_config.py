"""Triton's ``sequence_batching`` settings, read and checked once when a version loads.

Follows Triton's model configuration (``model_configuration.md`` "Sequence Batcher" and
``architecture.md`` "Stateful Models", and ``model_config.proto`` ``ModelSequenceBatching``):

- ``control_input``: tensors the server fills per request. START, END and READY take
  ``int32_false_true``, ``fp32_false_true`` or ``bool_false_true`` (``[false, true]``, which also
  fixes the tensor's datatype); CORRID takes ``data_type`` (TYPE_UINT64, TYPE_INT64, TYPE_UINT32,
  TYPE_INT32 or TYPE_STRING). Each has shape ``[1]``, with the batch dim when
  ``max_batch_size > 0``. They are graph inputs the client never sends.
- ``state``: implicit state. ``input_name`` is fed the sequence's state, ``output_name`` is
  read back and kept for the next request. The first request of a sequence gets
  ``initial_state`` (``zero_data``, or ``data_file`` read row-major from the model's
  ``initial_state/`` folder), or zeros when none is given.
- ``direct {}`` (the default) or ``oldest {...}``; ``max_sequence_idle_microseconds`` (0 means
  Triton's default of 1 s).
- ``iterative_sequence``: a request without a correlation id starts a sequence of its own (an id
  the server gives it), which ends when the request is released; a backend may give it back to be
  executed again (``kserve_v2.backend.rescheduling``; Triton's core ``IterativeSequencer``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import BYTES, DType
from kserve_v2.protocol.errors import ServerError
from kserve_v2.protocol.model_spec import TensorDeclaration
from kserve_v2.protocol.tensors import from_raw

Kind = mc.ModelSequenceBatching.Control
START, END, READY, CORRID = (Kind.CONTROL_SEQUENCE_START, Kind.CONTROL_SEQUENCE_END, Kind.CONTROL_SEQUENCE_READY,
                             Kind.CONTROL_SEQUENCE_CORRID)
DEFAULT_IDLE_US = 1_000_000  # Triton's default when max_sequence_idle_microseconds is 0
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
INITIAL_STATE_FOLDER = "initial_state"


class SequenceConfigError(ValueError):
    """A ``sequence_batching`` block this server cannot serve; the message is the load failure reason."""


@dataclass(frozen=True, slots=True)
class Control:
    """One control tensor: its graph input name, kind (``START``, ``END``, ``READY``, ``CORRID``),
    datatype, and its false and true values (0-d arrays; unused for CORRID)."""

    name: str
    kind: mc.ModelSequenceBatching.Control.Kind
    dtype: DType
    false: np.ndarray
    true: np.ndarray


@dataclass(frozen=True, slots=True)
class ImplicitState:
    """One implicit state: graph input and output names, datatype, and the initial value
    (shape ``dims``, without the batch dim)."""

    input_name: str
    output_name: str
    dtype: DType
    initial: np.ndarray


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    """A model's sequence batching, ready for the ``SequenceBatcher``.

    Attributes:
        model: the model name (for error texts).
        batched: whether tensors carry a batch dim (``max_batch_size > 0``).
        max_batch: rows in one execution (``max_batch_size``, or 1 without batching).
        oldest: the ``oldest`` strategy (else ``direct``).
        slots: sequences one instance serves at once (direct: ``max_batch``; oldest:
            ``max_candidate_sequences``); later sequences wait in a backlog.
        preferred: oldest's ``preferred_batch_size`` values.
        delay_ns: the strategy's ``max_queue_delay_microseconds``, in ns.
        idle_ns: ``max_sequence_idle_microseconds`` in ns.
        flags: START / END / READY controls; corrid: the CORRID control or None.
        states: implicit states.
        iterative: ``iterative_sequence`` (see the module docstring).
    """

    model: str
    batched: bool
    max_batch: int
    oldest: bool
    slots: int
    preferred: tuple[int, ...]
    delay_ns: int
    idle_ns: int
    flags: tuple[Control, ...]
    corrid: Control | None
    states: tuple[ImplicitState, ...]
    iterative: bool = False

    @property
    def state_outputs(self) -> list[str]:
        """The graph outputs read back as state, in ``states`` order."""
        return [s.output_name for s in self.states]

    @classmethod
    def from_config(cls, config: mc.ModelConfig, model_dir: Path, inputs: Iterable[TensorDeclaration],
                    outputs: Iterable[TensorDeclaration]) -> SequenceSettings:
        """Read ``config.sequence_batching`` and check it against the graph's tensors.

        Raises:
            SequenceConfigError: a control without exactly one kind of false/true pair, an
                unsupported CORRID type, names that are not graph inputs/outputs or whose datatype
                or shape differs, state dims with -1, an unreadable or wrong-sized initial state file.
        """
        sb = config.sequence_batching
        graph_in = {t.name: t for t in inputs}
        graph_out = {t.name: t for t in outputs}
        batched = config.max_batch_size > 0
        flags: list[Control] = []
        corrid: Control | None = None
        for control_input in sb.control_input:
            for control in control_input.control:
                made = _control(control_input.name, control)
                _check_control(config.name, graph_in, made, batched)
                if made.kind == CORRID:
                    corrid = made
                else:
                    flags.append(made)
        states = tuple(_state(s, model_dir, graph_in, graph_out, batched) for s in sb.state)
        max_batch = config.max_batch_size if batched else 1
        oldest = sb.WhichOneof("strategy_choice") == "oldest"
        if oldest:
            slots = sb.oldest.max_candidate_sequences or max_batch
            preferred = tuple(sorted({s for s in sb.oldest.preferred_batch_size if 0 < s <= max_batch}))
            delay_us = sb.oldest.max_queue_delay_microseconds
        else:
            slots, preferred, delay_us = max_batch, (), sb.direct.max_queue_delay_microseconds
        idle_us = sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        return cls(config.name, batched, max_batch, oldest, max(slots, 1), preferred, delay_us * 1000,
                   idle_us * 1000, tuple(flags), corrid, states, sb.iterative_sequence)


def reserved_names(config: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """Graph inputs and outputs the server feeds and reads itself (controls and state), which
    auto-complete leaves out of ``input`` and ``output`` and clients never send."""
    sb = config.sequence_batching
    inputs = {c.name for c in sb.control_input} | {s.input_name for s in sb.state}
    return inputs, {s.output_name for s in sb.state}


def _control(name: str, control: mc.ModelSequenceBatching.Control) -> Control:
    kind_name = Kind.Kind.Name(control.kind).removeprefix("CONTROL_SEQUENCE_")
    if control.kind == CORRID:
        type_name = mc.DataType.Name(control.data_type)
        if type_name not in CORRID_TYPES:
            raise SequenceConfigError(f"sequence batching control '{name}' (CORRID) has data type {type_name}; "
                                      f"one of {list(CORRID_TYPES)} is needed")
        dtype = datatypes.BY_CONFIG[type_name]
        return Control(name, control.kind, dtype, np.zeros((), dtype.numpy), np.zeros((), dtype.numpy))
    pairs = [(values, dtype) for values, dtype in ((control.int32_false_true, "TYPE_INT32"),
                                                   (control.fp32_false_true, "TYPE_FP32"),
                                                   (control.bool_false_true, "TYPE_BOOL")) if values]
    if len(pairs) != 1 or len(pairs[0][0]) != 2:
        raise SequenceConfigError(
            f"sequence batching control '{name}' ({kind_name}) must give exactly one of int32_false_true, "
            "fp32_false_true or bool_false_true, with two values [false, true]"
        )
    values, type_name = pairs[0]
    dtype = datatypes.BY_CONFIG[type_name]
    return Control(name, control.kind, dtype, np.array(values[0], dtype.numpy), np.array(values[1], dtype.numpy))


def _state(state: mc.ModelSequenceBatching.State, model_dir: Path, graph_in: dict[str, TensorDeclaration],
           graph_out: dict[str, TensorDeclaration], batched: bool) -> ImplicitState:
    dtype = datatypes.BY_CONFIG[mc.DataType.Name(state.data_type)] if state.data_type else None
    if dtype is None:
        raise SequenceConfigError(f"state '{state.input_name}' needs a data_type")
    dims = tuple(state.dims)
    if any(d < 0 for d in dims):
        raise SequenceConfigError(f"state '{state.input_name}' has dims {list(dims)}: only fixed dims are supported")
    _check_graph(graph_in, state.input_name, dtype, dims, batched, "state input")
    _check_graph(graph_out, state.output_name, dtype, dims, batched, "state output")
    initial = np.zeros(dims, dtype.numpy) if dtype is not BYTES else np.full(dims, b"", dtype=object)
    for given in state.initial_state[:1]:
        if given.WhichOneof("state_data") == "data_file":
            path = model_dir / INITIAL_STATE_FOLDER / given.data_file
            if not path.resolve().is_relative_to((model_dir / INITIAL_STATE_FOLDER).resolve()) or not path.is_file():
                raise SequenceConfigError(f"initial state file '{given.data_file}' of state '{state.input_name}' "
                                          f"is not a file under '{INITIAL_STATE_FOLDER}/'")
            try:
                initial = from_raw(path.read_bytes(), dtype, dims, f"initial state file '{given.data_file}'").copy()
            except ServerError as err:
                raise SequenceConfigError(str(err)) from None
    return ImplicitState(state.input_name, state.output_name, dtype, initial)


def _check_control(model: str, graph: dict[str, TensorDeclaration], control: Control, batched: bool) -> None:
    """A control input is a model input of dims [1] (after the batch dim; a variable dim is accepted, which
    Triton refuses) and the control's datatype (Triton's onnxruntime backend checks and texts,
    ``ValidateBooleanSequenceControl``)."""
    found = graph.get(control.name)
    if found is None:
        raise SequenceConfigError(f"configuration specified sequence control '{control.name}', but model does not "
                                  "provide that input")
    dims = list(found.shape[1:] if batched else found.shape)
    if dims not in ([1], [-1]):
        raise SequenceConfigError(f"unable to load model '{model}', sequence control '{control.name}' in model has "
                                  f"dims [{','.join(map(str, dims))}] but dims [1] is expected")
    if found.dtype is not control.dtype:
        onnx_name = found.dtype.onnx.removeprefix("tensor(").removesuffix(")").upper()
        raise SequenceConfigError(f"unable to load model '{model}', sequence control '{control.name}', the model "
                                  f"expects data-type {onnx_name} but the model configuration specifies data-type "
                                  f"{control.dtype.config}")


def _check_graph(graph: dict[str, TensorDeclaration], name: str, dtype: DType, dims: tuple[int, ...], batched: bool,
                 what: str) -> None:
    """The tensor exists in the graph with this datatype and, where the graph gives a shape, these dims
    (after a dynamic batch dim when batched)."""
    found = graph.get(name)
    if found is None:
        raise SequenceConfigError(f"sequence batching {what} '{name}' is not a tensor of the model: it has {sorted(graph)}")
    if found.dtype is not dtype:
        raise SequenceConfigError(f"sequence batching {what} '{name}' is {dtype.config} in the configuration "
                                  f"but {found.dtype.config} in the model")
    expected = ((-1,) if batched else ()) + dims
    if found.shape and (len(found.shape) != len(expected) or any(
            g != -1 and e != -1 and g != e for g, e in zip(found.shape, expected, strict=True))):
        raise SequenceConfigError(f"sequence batching {what} '{name}' has shape {list(found.shape)} in the model, "
                                  f"but the server feeds {list(expected)}")
