"""Triton's ensembles: ``platform: "ensemble"`` models whose steps are other models.

``ensemble_scheduling { step [ { model_name, model_version, input_map, output_map } ] }``
(Triton's ``model_configuration.md`` "Ensemble Models" and ``architecture.md`` "Ensemble
Models"): ``input_map`` maps a step model's input to an ensemble tensor, ``output_map`` a step
model's output to an ensemble tensor; the ensemble's own inputs and outputs are ensemble tensors.

Checked at load, each failure a load error naming the step: the data flow (Triton's
``ValidateEnsembleSchedulingConfig`` rules and texts: every ensemble tensor written once, used,
reachable from the inputs, every output written; a step that can never run, as in a cycle), then
against the composing models (a model with no loaded version, a mapped name the model does not
have, a required input left unmapped, datatypes that differ, a step or output fed by different
decoupled steps). The checked steps (``plan``) are
run by the ensemble's scheduler (``kserve_v2.scheduling.ensemble_scheduler``), with the step choice
(``needed_steps``) and the batch-dim rule (``reshape_between``) of Triton's ensemble scheduler
defined here.

Decoupled steps (python_backend's ``decoupled_models.md``, "Decoupled models in ensembles"): a
step whose model is decoupled may answer a request with zero or many responses; each flows on
through the steps after it. An ensemble with such a step is decoupled itself (``decoupled``;
Triton's ``ValidateEnsembleConfig`` sets ``model_transaction_policy.decoupled`` in the ensemble's
config). As there, the tensors a step takes (and the ensemble outputs) must all come from the
same decoupled step's responses, or from none (``plan``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.backend.local_calls import Infer
from kserve_v2.codec.messages import InferRequest
from kserve_v2.protocol import datatypes
from kserve_v2.protocol.datatypes import DType
from kserve_v2.protocol.model_spec import ModelSpec, TensorSpec

PLATFORM = "ensemble"
# the one inference call of the server, as business logic scripting calls it: the codec's request in,
# its response (and report) out
StepRunner = Infer
# the server's stream call: a request in, each of its responses out, the last one final
StepStreamer = Callable[[InferRequest], AsyncGenerator[Streamed, None]]
# (model name, version or -1 for the newest) -> the READY version's interface, or None
SpecLookup = Callable[[str, int], ModelSpec | None]
# (model name, version or -1 for the newest) -> whether the READY version is decoupled
DecoupledLookup = Callable[[str, int], bool]


class EnsembleError(Exception):
    """An ensemble configuration that cannot be served; the message is the load failure reason."""


@dataclass(frozen=True, slots=True)
class Binding:
    """One mapped tensor of a step: the step model's tensor name, the ensemble tensor, its
    datatype and the model's configured dims (without the batch dim)."""

    model_tensor: str
    ensemble_tensor: str
    dtype: DType
    dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One validated step: the model (version -1: the newest READY one), its bindings, whether
    the model batches (``max_batch_size > 0``) and whether it is decoupled (zero or many responses
    per request)."""

    index: int
    model_name: str
    model_version: int
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    batching: bool = False
    decoupled: bool = False


def is_ensemble(config: mc.ModelConfig) -> bool:
    """Whether a configuration is an ensemble's."""
    return config.platform == PLATFORM


def composing_models(config: mc.ModelConfig) -> list[tuple[int, str, int]]:
    """(step index, model name, version or -1) of every step, in configuration order."""
    return [(i, s.model_name, s.model_version) for i, s in enumerate(config.ensemble_scheduling.step)]


def step_versions(config: mc.ModelConfig) -> list[tuple[str, str]]:
    """(model name, version string; "" for the newest) of every step of an ensemble (none for
    another model), as a request names them."""
    return [(name, str(version) if version > 0 else "") for _, name, version in composing_models(config)]


def check_config(config: mc.ModelConfig) -> None:
    """Check an ensemble configuration on its own (no composing model needed), completing its
    version policy in place.

    Raises:
        EnsembleError: what Triton rejects (texts from its ``model_config_utils.cc``), plus a step
            that can never run named by index and model.
    """
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        raise EnsembleError(f"ensemble scheduling must be set for ensemble {name} whose platform is {PLATFORM}")
    if config.instance_group:
        raise EnsembleError(f"instance group should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise EnsembleError(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise EnsembleError(f"must specify 'step' for ensemble '{name}'")
    if not config.input or not config.output:
        raise EnsembleError(f"ensemble '{name}' must declare its inputs and outputs")
    for tensor in _tensors(config):
        if tensor.data_type == mc.TYPE_INVALID or not tensor.dims:
            raise EnsembleError(f"tensor '{tensor.name}' of ensemble '{name}' must specify 'data_type' and 'dims'")
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    written: dict[str, int] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise EnsembleError(f"must specify '{field}' in step {index} of ensemble '{name}'")
        for mapped in step.output_map.values():
            if mapped in written:
                raise EnsembleError(f"ensemble tensor '{mapped}' can appear in an output map only once for "
                                    f"ensemble '{name}' step {index}")
            written[mapped] = index
    _check_flow(config, written)


def _tensors(config: mc.ModelConfig) -> list[mc.ModelInput | mc.ModelOutput]:
    """The ensemble's declared inputs, then its outputs."""
    return [*config.input, *config.output]


def _check_flow(config: mc.ModelConfig, written: Mapping[str, int]) -> None:
    """Every step must become runnable from the ensemble inputs; every tensor must be used."""
    name, steps = config.name, list(config.ensemble_scheduling.step)
    inputs = {t.name for t in config.input}
    consumed = {t for step in steps for t in step.input_map.values()}
    unused = sorted(inputs - consumed)
    if unused:
        raise EnsembleError(f"ensemble input '{unused[0]}' for ensemble {name}' is not used")  # Triton's text
    available, pending = set(inputs), list(range(len(steps)))
    while True:
        runnable = [i for i in pending if set(steps[i].input_map.values()) <= available]
        if not runnable:
            break
        for i in runnable:
            available.update(steps[i].output_map.values())
        pending = [i for i in pending if i not in runnable]
    if pending:
        index = pending[0]
        missing = sorted(set(steps[index].input_map.values()) - available)
        raise EnsembleError(f"ensemble '{name}' step {index} (model '{steps[index].model_name}') can never run: "
                            f"its input tensors {missing} are not made from the ensemble inputs by other steps "
                            "(a missing tensor or a cycle)")
    outputs = {t.name for t in config.output}
    unwritten = sorted(outputs - set(written))
    if unwritten:
        raise EnsembleError(f"output '{unwritten[0]}' for ensemble '{name}' is not written")
    for tensor, index in sorted(written.items()):
        if tensor not in outputs and tensor not in consumed:
            raise EnsembleError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}' (written by step {index})")


def plan(config: mc.ModelConfig, lookup: SpecLookup, is_decoupled: DecoupledLookup | None = None
         ) -> tuple[Step, ...]:
    """Check the steps against their models' interfaces and bind their tensors; ``is_decoupled``
    tells which step models are decoupled (none when None).

    Raises:
        EnsembleError: a step model with no loaded version (Triton's "ensemble '<e>' depends on
            '<m>' which has no loaded version"), a mapped tensor the model does not have, a
            required input left unmapped, or datatypes that differ; each naming the step. A step
            (or the ensemble's outputs) taking tensors that come from different decoupled steps, or
            from a decoupled step and from none, with Triton's text ("in ensemble <e>, step of
            model '<m>' receives inputs originated from different decoupled models", naming the
            ensemble for its outputs).
    """
    types: dict[str, DType] = {t.name: datatypes.BY_CONFIG[mc.DataType.Name(t.data_type)]
                               for t in _tensors(config)}
    steps = []
    for index, step in enumerate(config.ensemble_scheduling.step):
        where = f"ensemble '{config.name}' step {index} (model '{step.model_name}')"
        spec = lookup(step.model_name, step.model_version)
        if spec is None:
            version = f" whose required version {step.model_version} is not loaded" if step.model_version > 0 else \
                " which has no loaded version"
            raise EnsembleError(f"ensemble '{config.name}' depends on '{step.model_name}'{version} (step {index})")
        inputs = _bind(where, "input", step.input_map, spec.inputs, types)
        outputs = _bind(where, "output", step.output_map, spec.outputs, types)
        unmapped = [t.name for t in spec.inputs if not t.optional and t.name not in step.input_map]
        if unmapped:
            raise EnsembleError(f"{where}: the model's required inputs {unmapped} are not in the input_map")
        steps.append(Step(index, step.model_name, step.model_version, inputs, outputs, spec.max_batch_size > 0,
                          is_decoupled is not None and is_decoupled(step.model_name, step.model_version)))
    _check_decoupled(config, steps)
    return tuple(steps)


def decoupled(steps: Sequence[Step]) -> bool:
    """Whether an ensemble of these steps is decoupled: one of them is (Triton's
    ``ValidateEnsembleConfig`` sets the ensemble's ``model_transaction_policy.decoupled`` so)."""
    return any(step.decoupled for step in steps)


def _check_decoupled(config: mc.ModelConfig, steps: Sequence[Step]) -> None:
    """Label each ensemble tensor with the decoupled step whose responses it comes from (0: none; the
    ensemble inputs are 0, a decoupled step's outputs a new label, another step's outputs its inputs'
    label), as Triton's ``ValidateEnsembleConfig`` does; a step, or the ensemble outputs, whose tensors
    carry different labels cannot run (its inputs would not come in matching sets).

    Raises:
        EnsembleError: Triton's text, naming the step's model (or the ensemble, for its outputs).
    """
    labels = {t.name: 0 for t in config.input}
    count, pending = 0, list(steps)
    while pending:  # every step becomes runnable (check_config): in data-flow order
        step = next(s for s in pending if all(b.ensemble_tensor in labels for b in s.inputs))
        pending.remove(step)
        label = _one_label(config.name, step.model_name, [labels[b.ensemble_tensor] for b in step.inputs])
        if step.decoupled:
            count += 1
            label = count
        labels.update((b.ensemble_tensor, label) for b in step.outputs)
    _one_label(config.name, config.name, [labels[t.name] for t in config.output if t.name in labels])


def _one_label(ensemble_name: str, model: str, labels: Sequence[int]) -> int:
    """The one label of a step's (or the outputs') tensors.

    Raises:
        EnsembleError: the labels differ (Triton's text).
    """
    if len(set(labels)) > 1:
        raise EnsembleError(f"in ensemble {ensemble_name}, step of model '{model}' receives inputs originated from "
                            "different decoupled models")
    return labels[0] if labels else 0


def step_labels(config: mc.ModelConfig, own: Mapping[str, tuple[str, ...]],
                lookup: SpecLookup) -> dict[str, tuple[str, ...]]:
    """The class labels of the ensemble's outputs: ``own`` (from its ``label_filename``), and for an
    output without them (no file, or an empty first line), those of the step output written to it.

    Triton's model lifecycle completes an ensemble's label provider this way at load, so that
    classification through an ensemble names classes without a label file of its own. ``lookup``
    gives the loaded step models' specs; a step it does not find adds nothing.
    """
    labels = dict(own)
    missing = {t.name for t in config.output if not labels.get(t.name, ("",))[0]}
    for step in config.ensemble_scheduling.step:
        for model_tensor, ensemble_tensor in step.output_map.items():
            spec = lookup(step.model_name, step.model_version) if ensemble_tensor in missing else None
            found = next((t.labels for t in spec.outputs if t.name == model_tensor), ()) if spec else ()
            if found:
                labels[ensemble_tensor] = found
    return labels


def needed_steps(steps: Sequence[Step], outputs: Sequence[str]) -> tuple[Step, ...]:
    """The steps that the ensemble outputs ``outputs`` need, in configuration order: those writing
    one of them, and, in turn, those writing an input of a needed step (Triton prunes the others)."""
    wanted: set[str] = set(outputs)
    needed: set[int] = set()
    changed = True
    while changed:  # configuration order need not be the data flow's: repeat until nothing is added
        changed = False
        for step in steps:
            if step.index not in needed and any(b.ensemble_tensor in wanted for b in step.outputs):
                needed.add(step.index)
                wanted.update(b.ensemble_tensor for b in step.inputs)
                changed = True
    return tuple(step for step in steps if step.index in needed)


def reshape_between(dims: Sequence[int], batching: bool, batch_size: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tensor takes on its way into a model (or out of the ensemble), as Triton's
    ensemble scheduler gives it (``ReshapeTensorDims``).

    Args:
        dims: the configured dims of the receiving tensor, without the batch dim (-1: any).
        batching: whether the receiver batches (a step model with ``max_batch_size > 0``, or a
            batching ensemble request whose batch size is not 0).
        batch_size: the batch size of the request that produced the tensor; 0 when it came from
            a model (or an ensemble request) without batching.
        shape: the tensor's shape.

    Returns:
        ``shape`` with a batch dim of 1 added, when a non-batching producer feeds a batching
        receiver and the whole shape matches ``dims``; ``shape`` without its first dim, when a
        batching producer of batch size 1 feeds a non-batching receiver and the whole shape does
        not match ``dims``; else ``shape`` as it is.
    """
    if batching == (batch_size != 0):
        return shape
    if batching:
        return (1, *shape) if _matches(dims, shape) else shape
    return shape[1:] if batch_size == 1 and not _matches(dims, shape) else shape


def _matches(dims: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a shape fits configured dims, -1 on either side matching anything (Triton's
    ``CompareDimsWithWildcard``)."""
    return len(dims) == len(shape) and all(d == -1 or s == -1 or d == s for d, s in zip(dims, shape, strict=True))


def _bind(where: str, kind: str, mapping: Mapping[str, str], tensors: Sequence[TensorSpec],
          types: dict[str, DType]) -> tuple[Binding, ...]:
    by_name = {t.name: t for t in tensors}
    bindings = []
    for model_tensor, ensemble_tensor in sorted(mapping.items()):
        tensor = by_name.get(model_tensor)
        if tensor is None:
            raise EnsembleError(f"{where}: the model has no {kind} '{model_tensor}' (it has {sorted(by_name)})")
        known = types.setdefault(ensemble_tensor, tensor.dtype)
        if known is not tensor.dtype:
            raise EnsembleError(f"{where}: ensemble tensor '{ensemble_tensor}' is {known.v2} but the model's {kind} "
                                f"'{model_tensor}' is {tensor.dtype.v2}")
        bindings.append(Binding(model_tensor, ensemble_tensor, tensor.dtype, tensor.dims))
    return tuple(bindings)
