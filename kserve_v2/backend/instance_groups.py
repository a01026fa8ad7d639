"""The instances of a model version's completed instance groups, as Triton's model lifecycle makes
them (Triton's core ``TritonModelInstance::CreateInstances``; the model configuration docs,
"Instance Groups"): for each group in order, ``count`` instances named ``<group>_<index>``; a
KIND_GPU group makes each of them on EVERY GPU its ``gpus`` lists (so instances on different GPUs
share a name), any other group on the CPU (device 0). The one statement of that rule: the ONNX
backend's sessions (``kserve_v2.runtime.placement``), python models' instances, the instance pool's
size, the rate limiter's instances and the BLS self-call guard all read it here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kserve_v2._proto import model_config_pb2 as mc

KIND_GPU = mc.ModelInstanceGroup.KIND_GPU


@dataclass(frozen=True)
class Instance:
    """One instance of a version.

    Attributes:
        group: its instance group's name.
        index: its index in the group (0 .. count-1; the same on each GPU of a KIND_GPU group).
        kind: its group's ``ModelInstanceGroup.Kind`` (KIND_GPU, KIND_CPU, ...).
        device: the GPU id for KIND_GPU, else 0 (Triton's device id of CPU instances).
    """

    group: str
    index: int
    kind: int
    device: int

    @property
    def name(self) -> str:
        """Triton's instance name, ``<group>_<index>``."""
        return f"{self.group}_{self.index}"

    @property
    def on_gpu(self) -> bool:
        """Whether it runs on a GPU (its ``device``)."""
        return self.kind == KIND_GPU


def instances(groups: Sequence[mc.ModelInstanceGroup]) -> Iterator[tuple[mc.ModelInstanceGroup, Instance]]:
    """Each instance of completed instance groups with its group, in Triton's order: group by group,
    index by index, and for a KIND_GPU group each GPU in the order ``gpus`` lists them (a KIND_GPU
    group with no ``gpus`` left, which completion never leaves, makes its ``count`` on device 0)."""
    for group in groups:
        devices = list(group.gpus) if group.kind == KIND_GPU and group.gpus else [0]
        for index in range(group.count):
            for device in devices:
                yield group, Instance(group.name, index, group.kind, device)


def instance_count(groups: Sequence[mc.ModelInstanceGroup]) -> int:
    """How many instances ``instances`` makes: executions of the version that may run at once."""
    return sum(1 for _ in instances(groups))
