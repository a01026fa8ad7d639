"""config.pbtxt fields this server does not act on are refused or warned about (kserve_v2.repository.config_fields)."""

from __future__ import annotations

import logging

import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.repository import config_fields
from kserve_v2.repository.config_fields import UnsupportedField

BASE = 'name: "m" max_batch_size: 4 input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [16] }]\n'


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(BASE + text, mc.ModelConfig())


@pytest.mark.parametrize(("text", "path"), [
    ('sequence_batching { direct { minimum_slot_utilization: 0.5 } }',
     "sequence_batching.direct.minimum_slot_utilization"),
    ('ensemble_scheduling { step [{ model_name: "a" model_version: -1 model_namespace: "ns" }] }',
     "ensemble_scheduling.step.model_namespace"),
    ('instance_group [{ count: 1 kind: KIND_CPU passive: true }]', "instance_group.passive"),
    ('model_repository_agents { agents [{ name: "checksum" }] }', "model_repository_agents"),
])
def test_a_refused_field_fails_the_load_naming_it(text: str, path: str) -> None:
    with pytest.raises(UnsupportedField, match=f"config field '{path}' is not supported by this server"):
        config_fields.check(parse(text))


def test_a_warned_field_is_logged_once_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    config = parse('optimization { cuda { graphs: true } input_pinned_memory { enable: true } '
                   'execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" }] } }\n'
                   'instance_group [{ count: 1 kind: KIND_CPU profile: ["0"] }, { count: 1 kind: KIND_CPU profile: ["1"] }]')
    with caplog.at_level(logging.WARNING, logger=config_fields.__name__):
        warned = config_fields.check(config)
    assert sorted(warned) == ["instance_group.profile", "optimization.cuda",
                              "optimization.execution_accelerators.gpu_execution_accelerator",
                              "optimization.input_pinned_memory"]
    texts = [r.getMessage() for r in caplog.records]
    assert sum("'instance_group.profile'" in t for t in texts) == 1  # two groups set it: one warning
    assert any("config field 'optimization.cuda' has no effect on this server" in t for t in texts)


def test_acted_on_fields_pass_in_silence(caplog: pytest.LogCaptureFixture) -> None:
    config = parse('dynamic_batching { preferred_batch_size: [2] priority_levels: 2 '
                   'priority_queue_policy { key: 1 value: { max_queue_size: 3 } } }\n'
                   'instance_group [{ count: 2 kind: KIND_CPU rate_limiter { resources [{ name: "R" count: 1 }] } }]\n'
                   'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')
    with caplog.at_level(logging.WARNING, logger=config_fields.__name__):
        assert config_fields.check(config) == []
    assert caplog.records == []


def test_set_paths_descend_into_repeated_fields_and_map_values() -> None:
    config = parse('dynamic_batching { priority_queue_policy { key: 1 value: { max_queue_size: 3 } } }')
    paths = config_fields.set_paths(config)
    assert "input.dims" in paths
    assert "dynamic_batching.priority_queue_policy.max_queue_size" in paths


def test_image_format_needs_three_dims() -> None:
    with pytest.raises(UnsupportedField, match="model input NHWC/NCHW require 3 dims"):
        config_fields.check(parse('input [{ name: "IMG" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 8] }]'))
    config_fields.check(parse('input [{ name: "IMG" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 8, 8] }]'))
