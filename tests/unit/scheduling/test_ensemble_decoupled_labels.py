"""Decoupled steps in an ensemble's plan (kserve_v2.scheduling.ensemble): which steps are decoupled, whether
the ensemble is, and Triton's "receives inputs originated from different decoupled models" load errors
(``ValidateEnsembleConfig``; the cases of Triton's qa/L0_model_config ``invalid_decoupled_branching``)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.model_spec import ModelSpec
from kserve_v2.scheduling.ensemble import EnsembleError, check_config, decoupled, plan
from tests.pbtxt import ensemble_step

ONE = "data_type: TYPE_INT32 dims: [ 1 ]"
# "repeat" is decoupled (IN -> OUT, IDX), "plus" is not (X, optional Z -> Y)
SPECS = {
    "repeat": ModelSpec.from_config(text_format.Parse(
        f'name: "repeat" input [{{ name: "IN" {ONE} }}] output [{{ name: "OUT" {ONE} }}, {{ name: "IDX" {ONE} }}]',
        mc.ModelConfig())),
    "plus": ModelSpec.from_config(text_format.Parse(
        f'name: "plus" input [{{ name: "X" {ONE} }}, {{ name: "Z" {ONE} optional: true }}] '
        f'output [{{ name: "Y" {ONE} }}]', mc.ModelConfig())),
}


def _config(name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]], outputs: tuple[str, ...] = ("OUT",)
            ) -> mc.ModelConfig:
    declared = ", ".join(f'{{ name: "{o}" {ONE} }}' for o in outputs)
    config = text_format.Parse(
        f'name: "{name}" platform: "ensemble" input [ {{ name: "IN" {ONE} }} ] output [ {declared} ] '
        f'ensemble_scheduling {{ step [ {", ".join(ensemble_step(*s) for s in steps)} ] }}', mc.ModelConfig())
    check_config(config)
    return config


def _plan(config: mc.ModelConfig) -> tuple[bool, ...]:
    steps = plan(config, lambda model, _: SPECS.get(model), lambda model, _: model == "repeat")
    return (decoupled(steps), *(step.decoupled for step in steps))


def test_an_ensemble_with_a_decoupled_step_is_decoupled() -> None:
    chain = _config("chain", [("repeat", {"IN": "IN"}, {"OUT": "r"}), ("plus", {"X": "r"}, {"Y": "OUT"})])
    assert _plan(chain) == (True, True, False)
    # a step before the decoupled one, and two decoupled steps in a row
    before = _config("before", [("plus", {"X": "IN"}, {"Y": "p"}), ("repeat", {"IN": "p"}, {"OUT": "r", "IDX": "i"}),
                                ("plus", {"X": "r", "Z": "i"}, {"Y": "q"}), ("repeat", {"IN": "q"}, {"OUT": "OUT"})])
    assert _plan(before) == (True, False, True, False, True)
    plain = _config("plain", [("plus", {"X": "IN"}, {"Y": "OUT"})])
    assert _plan(plain) == (False, False)
    assert plan(chain, lambda model, _: SPECS.get(model))[0].decoupled is False  # no lookup: none is decoupled


@pytest.mark.parametrize("name, steps, outputs, model", [
    # invalid_decoupled_branching_2: the outputs come from two decoupled steps
    ("two", [("repeat", {"IN": "IN"}, {"OUT": "OUT"}), ("repeat", {"IN": "IN"}, {"IDX": "IDX"})], ("OUT", "IDX"), "two"),
    # invalid_decoupled_branching: a step takes the outputs of two decoupled steps
    ("join", [("repeat", {"IN": "IN"}, {"OUT": "a"}), ("repeat", {"IN": "IN"}, {"OUT": "b"}),
              ("plus", {"X": "a", "Z": "b"}, {"Y": "OUT"})], ("OUT",), "plus"),
    # a step takes the ensemble's input and a decoupled step's output
    ("mixed", [("repeat", {"IN": "IN"}, {"OUT": "a"}), ("plus", {"X": "a", "Z": "IN"}, {"Y": "OUT"})], ("OUT",), "plus"),
    # the outputs come from a decoupled step and from none
    ("outputs", [("repeat", {"IN": "IN"}, {"OUT": "OUT"}), ("plus", {"X": "IN"}, {"Y": "Y"})], ("OUT", "Y"), "outputs"),
])
def test_inputs_from_different_decoupled_steps_are_refused(name: str, steps: list, outputs: tuple[str, ...],
                                                           model: str) -> None:
    with pytest.raises(EnsembleError) as refused:
        _plan(_config(name, steps, outputs))
    assert str(refused.value) == (f"in ensemble {name}, step of model '{model}' receives inputs originated from "
                                  "different decoupled models")
