"""The instances of completed instance groups, Triton's rule stated once (kserve_v2.backend.instance_groups): count on
each GPU a KIND_GPU group lists, count on the CPU otherwise, named ``<group>_<index>``; what the rate limiter registers
for them (a per-device resource on each instance's own GPU)."""

from __future__ import annotations

from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.instance_groups import instance_count, instances
from kserve_v2.scheduling.rate_limiter import RateLimiter


def _groups(text: str) -> list[mc.ModelInstanceGroup]:
    return list(text_format.Parse(text, mc.ModelConfig()).instance_group)


GROUPS = ('instance_group [{ name: "g" kind: KIND_GPU count: 2 gpus: [1, 3] }, { name: "c" kind: KIND_CPU count: 1 }]')


def test_count_on_each_gpu_listed_then_the_cpu_groups() -> None:
    placed = [(i.name, i.device, i.on_gpu) for _, i in instances(_groups(GROUPS))]
    assert placed == [("g_0", 1, True), ("g_0", 3, True), ("g_1", 1, True), ("g_1", 3, True), ("c_0", 0, False)]
    assert instance_count(_groups(GROUPS)) == 5


def test_the_rate_limiter_registers_every_instance_on_its_own_gpu() -> None:
    text = ('instance_group [{ name: "g" kind: KIND_GPU count: 1 gpus: [0, 1] '
            'rate_limiter { resources [{ name: "R" count: 2 }] } }]')
    model = RateLimiter().register(_groups(text))
    assert [instance.needs for instance in model.instances] == [{(0, "R"): 2}, {(1, "R"): 2}]  # each on its own GPU
