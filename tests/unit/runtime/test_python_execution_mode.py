"""Where a python model runs: its ``EXECUTION_MODE`` parameter, else the server's
``--backend-config=python,execution-mode=...``; another value names the key and the values."""

from __future__ import annotations

import pytest

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.runtime.python.backend import execution_mode


@pytest.mark.parametrize(("value", "default", "mode"), [
    (None, "in_process", "in_process"), (None, "process", "process"), ("in_process", "process", "in_process"),
    ("process", "in_process", "process")])
def test_the_parameter_wins_over_the_servers_default(value: str | None, default: str, mode: str) -> None:
    config = mc.ModelConfig(name="m")
    if value is not None:
        config.parameters["EXECUTION_MODE"].string_value = value
    assert execution_mode(config, default) == mode


def test_an_unknown_execution_mode_names_the_key_and_the_values() -> None:
    config = mc.ModelConfig(name="m")
    config.parameters["EXECUTION_MODE"].string_value = "Process"
    with pytest.raises(ValueError, match="model 'm': parameter EXECUTION_MODE must be one of 'in_process', 'process', "
                                         "not 'Process'"):
        execution_mode(config, "in_process")
