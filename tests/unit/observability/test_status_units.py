"""The /ws/status object (kserve_v2.observability.status) read through its Records protocol, with no repository."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from kserve_v2.observability.status import StatusReporter


class State(enum.Enum):
    READY = "READY"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class Version:
    state: State
    model: Any = None


@dataclass
class Record:
    name: str
    versions: dict[int, Version] = field(default_factory=dict)
    config: Any = None
    memory_bytes: int = 0


@dataclass
class Records:
    items: list[Record]

    def records(self) -> list[Record]:
        return self.items


def test_snapshot_states_and_counters() -> None:
    ready = SimpleNamespace(on_gpu=False, inflight=3)
    records = Records([Record("a", {1: Version(State.READY, ready), 2: Version(State.LOADING)}, memory_bytes=10),
                       Record("b", {1: Version(State.UNAVAILABLE)}, memory_bytes=99)])
    registry = CollectorRegistry()
    Counter("sie_requests", "requests", ["model"], registry=registry).labels("a").inc(2)
    snapshot = StatusReporter(records, registry, gpus=0).snapshot()
    assert snapshot["loaded_models"] == ["a"] and snapshot["gpu"] == "" and snapshot["gpus"] == []
    a, b = snapshot["models"]
    assert (a["state"], a["versions"], a["device"], a["memory_bytes"], a["queue_depth"]) == (
        "loaded", {"1": "READY", "2": "LOADING"}, "cpu", 10, 3)
    assert (b["state"], b["device"], b["memory_bytes"]) == ("available", None, 0)
    assert snapshot["counters"]["sie_requests"] == [{"labels": {"model": "a"}, "value": 2.0}]
