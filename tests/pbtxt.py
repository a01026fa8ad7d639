"""config.pbtxt fragments the server and unit tests share (Triton's model configuration text format)."""

from __future__ import annotations

from collections.abc import Mapping


def ensemble_step(model: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> str:
    """One ``ensemble_scheduling.step`` of the newest version of ``model``: its ``input_map`` (the
    model's input -> the ensemble tensor) and ``output_map`` (the model's output -> the ensemble tensor)."""
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'
