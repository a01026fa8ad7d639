"""The scheduler a version gets is picked once, at load, from its configuration (kserve_v2.models.version.open_version,
Triton's scheduling_choice), and a configuration naming two schedulers does not load."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.models.version import open_version
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.repository.config import ConfigError, read_config
from kserve_v2.scheduling.base import DirectScheduler
from kserve_v2.scheduling.dynamic_batcher import DynamicBatcher
from kserve_v2.scheduling.sequence_batcher import SequenceBatcher
from kserve_v2.scheduling.sequence_config import SequenceSettings
from tests.unit.fakes import Doubling

FP32 = BY_V2["FP32"]
TENSORS = 'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }] output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }] '


def config(text: str) -> mc.ModelConfig:
    parsed = text_format.Parse('name: "m" ' + TENSORS + text, mc.ModelConfig())
    parsed.instance_group.add(count=1)
    return parsed


@pytest.mark.parametrize(("blocks", "expected"), [
    ("max_batch_size: 4", DirectScheduler),
    ("max_batch_size: 4 dynamic_batching {}", DynamicBatcher),
    ("max_batch_size: 0 dynamic_batching {}", DirectScheduler),  # nothing to merge rows of
    ("max_batch_size: 4 sequence_batching {}", SequenceBatcher),
])
def test_the_configuration_picks_the_scheduler(blocks: str, expected: type) -> None:
    completed = config(blocks)
    sequence = (SequenceSettings.from_config(completed, Path("."), Doubling.inputs, Doubling.outputs)
                if completed.HasField("sequence_batching") else None)
    version = open_version("m", 1, completed, Doubling(), sequence)
    try:
        assert type(version.scheduler) is expected
        if expected is not SequenceBatcher:  # a sequence needs its parameters; the others run the request
            feeds = {"INPUT0": np.ones((1, 2), np.float32)}
            execution, _, _ = asyncio.run(version.scheduler.submit(feeds, ["OUTPUT0"], {}, 1))
            assert execution.outputs[0].tolist() == [[2.0, 2.0]]
    finally:
        version.close()


@pytest.mark.parametrize("blocks", ["dynamic_batching {} sequence_batching {}",
                                    "sequence_batching {} dynamic_batching {}",
                                    'dynamic_batching {} ensemble_scheduling { step [{ model_name: "x" }] }'])
def test_two_scheduler_blocks_are_a_load_error_naming_both(tmp_path: Path, blocks: str) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "m" max_batch_size: 4 ' + blocks)
    with pytest.raises(ConfigError, match=r"failed to parse model configuration: .*is specified along with field .*"
                                          r"another member of oneof \"scheduling_choice\""):
        read_config(tmp_path, "m")


def test_two_scheduler_blocks_in_a_json_override_are_a_load_error(tmp_path: Path) -> None:
    override = json.dumps({"name": "m", "dynamic_batching": {}, "sequence_batching": {}})
    with pytest.raises(ConfigError, match=r"failed to parse model configuration: .*multiple \"scheduling_choice\""):
        read_config(tmp_path, "m", override)
