"""--workers N without processes: the merges of every replica's answers, the supervisor's control
log and its routing of control calls over real socket-pair links, and the CPUs ``auto`` counts."""

from __future__ import annotations

import asyncio
import math
import socket
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.host.cpus import cgroup_quota, usable_cpus
from kserve_v2.protocol.errors import InternalError, InvalidInput
from kserve_v2.workers.replica_views import merge_families, merge_index, merge_statistics, merge_status, values
from kserve_v2.workers.replicas import Call, Link, Outcome, ReplicaGroup, ReplicaState
from kserve_v2.workers.supervisor import ControlLog, Supervisor, _Replica

# ---- merges ------------------------------------------------------------------------------------


def _stats(success: int, last: int, batch: int) -> pb.ModelStatisticsResponse:
    response = pb.ModelStatisticsResponse()
    row = response.model_stats.add(name="m", version="1", last_inference=last, inference_count=success * batch,
                                   execution_count=success)
    row.inference_stats.success.count, row.inference_stats.success.ns = success, success * 100
    entry = row.batch_stats.add(batch_size=batch)
    entry.compute_infer.count, entry.compute_infer.ns = success, success * 10
    row.response_stats["r"].success.count = success
    return response


def test_statistics_add_up_per_version_and_batch_size() -> None:
    merged = merge_statistics([_stats(3, 1000, 1), _stats(2, 2000, 1), _stats(1, 500, 4)])
    [row] = merged.model_stats
    assert (row.inference_count, row.execution_count, row.last_inference) == (3 + 2 + 4, 6, 2000)
    assert (row.inference_stats.success.count, row.inference_stats.success.ns) == (6, 600)
    assert {b.batch_size: (b.compute_infer.count, b.compute_infer.ns) for b in row.batch_stats} == {1: (5, 50), 4: (1, 10)}
    assert row.response_stats["r"].success.count == 6


def _index(*rows: tuple[str, str, str, str]) -> pb.RepositoryIndexResponse:
    response = pb.RepositoryIndexResponse()
    for name, version, state, reason in rows:
        response.models.add(name=name, version=version, state=state, reason=reason)
    return response


def test_index_shows_a_model_as_the_replica_where_it_is_not_ready() -> None:
    a = _index(("x", "1", "READY", ""), ("y", "1", "READY", ""), ("z", "", "", ""))
    b = _index(("x", "1", "LOADING", ""), ("y", "1", "READY", ""), ("z", "", "", ""))
    rows = [(m.name, m.version, m.state) for m in merge_index([a, b], ready_only=False).models]
    assert rows == [("x", "1", "LOADING"), ("y", "1", "READY"), ("z", "", "")]
    assert [m.name for m in merge_index([a, b], ready_only=True).models] == ["y"]
    only_a = merge_index([a, _index(("y", "1", "READY", ""), ("z", "", "", ""))], ready_only=False)
    assert [(m.name, m.state) for m in only_a.models if m.name == "x"] == [("x", "")]  # b has no record of x


def _registry(requests: float, cpu: float, started: float, quantile_value: float) -> list[Any]:
    registry = CollectorRegistry()
    Counter("reqs", "requests", ["model"], registry=registry).labels("m").inc(requests)
    Gauge("nv_cpu_utilization", "host cpu", registry=registry).set(cpu)
    Gauge("process_start_time_seconds", "start", registry=registry).set(started)
    Histogram("lat", "latency", buckets=(1.0,), registry=registry).observe(0.5 * requests)
    summary = Summary("sum_us", "summary", registry=registry)
    summary.observe(requests)
    families = list(registry.collect())
    for family in families:  # a summary with a quantile series, as kserve_v2.observability.summaries exports
        if family.name == "sum_us":
            family.add_sample("sum_us", {"quantile": "0.5"}, quantile_value)
    return families


def test_metric_families_keep_names_and_labels_and_combine_by_kind() -> None:
    merged = {f.name: f for f in merge_families([_registry(2, 0.5, 100.0, 7.0), _registry(3, 0.4, 90.0, 9.0)])}
    sample = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in merged.values() for s in f.samples}
    assert sample[("reqs_total", (("model", "m"),))] == 5  # counters add up
    assert sample[("nv_cpu_utilization", ())] == 0.5  # the host's reading: the largest, not a sum
    assert sample[("process_start_time_seconds", ())] == 90.0  # the earliest start
    assert sample[("lat_count", ())] == 2 and sample[("lat_bucket", (("le", "1.0"),))] == 1
    assert sample[("sum_us_count", ())] == 2 and sample[("sum_us_sum", ())] == 5
    assert sample[("sum_us", (("quantile", "0.5"),))] == 9.0  # quantiles cannot add: the largest
    assert merged["reqs"].type == "counter" and merged["lat"].type == "histogram"


def test_status_objects_add_up() -> None:
    def snapshot(state: str, depth: int, count: float, uptime: int) -> dict[str, Any]:
        return {"models": [{"name": "m", "state": state, "versions": {"1": "READY"}, "memory_bytes": 10,
                            "queue_depth": depth, "queue_pending_items": depth}],
                "loaded_models": ["m"] if state == "loaded" else [], "server": {"uptime_seconds": uptime, "pid": 1},
                "counters": {"c": [{"labels": {"model": "m"}, "value": count}]},
                "histograms": {"h": [{"labels": {}, "buckets": {"1.0": count}, "count": count, "sum": count}]}}

    merged = merge_status([snapshot("loaded", 1, 2, 5), snapshot("loading", 2, 3, 9)])
    [model] = merged["models"]
    assert (model["state"], model["memory_bytes"], model["queue_depth"]) == ("loading", 20, 3)
    assert merged["loaded_models"] == [] and merged["server"]["uptime_seconds"] == 9
    assert merged["counters"]["c"] == [{"labels": {"model": "m"}, "value": 5}]
    assert merged["histograms"]["h"][0]["buckets"] == {"1.0": 5} and merged["histograms"]["h"][0]["count"] == 5


def test_values_raise_only_when_no_replica_answered() -> None:
    assert values([Outcome(1), Outcome(error=InvalidInput("x"))]) == [1]
    with pytest.raises(InvalidInput, match="first"):
        values([Outcome(error=InvalidInput("first")), Outcome(error=InvalidInput("second"))])


# ---- the control log ---------------------------------------------------------------------------


def test_control_log_keeps_the_latest_call_per_key_in_order() -> None:
    journal = ControlLog()
    calls = [Call("control", "load a", "model:a"), Call("control", "trace", None), Call("control", "load b", "model:b"),
             Call("control", "unload a", "model:a"), Call("poll", "x", logged=False),
             Call("control", "shm r1", "shm:r1"), Call("control", "shm r2", "shm:r2"),
             Call("control", "unregister all", "shm:*")]
    for call in calls:
        journal.add(call)
    assert [c.payload for c in journal.calls()] == ["trace", "load b", "unload a", "unregister all"]


# ---- routing over real links, without forks ------------------------------------------------------


class FakeReplica:
    """A replica's side of a link: applies control calls to a set of names, optionally failing one."""

    def __init__(self, index: int, sock: socket.socket, fail: str = "") -> None:
        self.names: set[str] = set()
        self.group = ReplicaGroup(index, sock, restarted=False)
        self.group.handle("control", self.apply)
        self.fail = fail

    async def apply(self, payload: tuple[str, str]) -> Outcome:
        action, name = payload
        if action == "add":
            if name == self.fail:
                raise InternalError(f"cannot add {name} here")
            self.names.add(name)
            return Outcome(name, undo=(Call("control", ("remove", name), f"n:{name}"),))
        self.names.discard(name)
        return Outcome(name)


def _group(fail: tuple[str, ...]) -> tuple[Supervisor, list[FakeReplica]]:
    supervisor = Supervisor(len(fail), lambda *_: 0)
    replicas = []
    for index, failing in enumerate(fail):
        ours, theirs = socket.socketpair()
        replica = _Replica(index, pid=-1, sock=ours, initial=True, started_at=0.0)
        replica.link = Link(partial(supervisor._serve, replica), partial(supervisor._notice, replica))
        supervisor._replicas[index] = replica
        replicas.append(FakeReplica(index, theirs, failing))
    return supervisor, replicas


def test_a_call_reaches_every_replica_and_a_split_outcome_is_taken_back() -> None:
    async def run() -> None:
        supervisor, replicas = _group(("", "b"))  # replica 1 cannot add "b"
        readers = [asyncio.create_task(r.link.run(r.sock)) for r in supervisor._replicas.values()]  # type: ignore[union-attr]
        for replica in replicas:
            replica.group.start()
        for replica in replicas:
            replica.group.report(ReplicaState(started=True, ready=True, models={"m": frozenset({1})}))
            await replica.group.join()
        assert await replicas[1].group.everywhere(Call("control", ("add", "a"), "n:a")) == "a"
        assert [r.names for r in replicas] == [{"a"}, {"a"}]
        with pytest.raises(InternalError, match="cannot add b here"):
            await replicas[0].group.everywhere(Call("control", ("add", "b"), "n:b"))
        assert [r.names for r in replicas] == [{"a"}, {"a"}]  # replica 0's "b" was taken back
        assert [c.payload for c in supervisor._log.calls()] == [("add", "a"), ("remove", "b")]
        assert all(r.group.view.ready and r.group.view.replicas == 2 for r in replicas)
        replicas[0].group.report(ReplicaState(started=True, ready=True, models={"m": frozenset({1, 2})}))
        await asyncio.sleep(0.05)
        assert replicas[1].group.view.unsettled == frozenset({"m"})  # its versions differ between replicas
        outcomes = await replicas[0].group.gather(Call("control", ("remove", "zzz")))
        assert [o.value for o in outcomes] == ["zzz", "zzz"]
        for task in readers:
            task.cancel()

    asyncio.run(run())


def test_a_replica_that_applied_a_model_change_first_holds_it_unready_until_every_replica_has() -> None:
    async def run() -> None:
        supervisor, replicas = _group(("", ""))
        readers = [asyncio.create_task(r.link.run(r.sock)) for r in supervisor._replicas.values()]  # type: ignore[union-attr]
        release = asyncio.Event()
        applied = asyncio.Event()

        async def slow(payload: tuple[str, str]) -> Outcome:
            await release.wait()
            return await replicas[1].apply(payload)

        async def fast(payload: tuple[str, str]) -> Outcome:
            outcome = await replicas[0].apply(payload)
            applied.set()
            return outcome

        replicas[0].group.handle("control", fast)
        replicas[1].group.handle("control", slow)
        for replica in replicas:
            replica.group.track(lambda name, r=replica: frozenset({1}) if name in r.names else frozenset())
            replica.group.start()
            await replica.group.join()
        call = asyncio.create_task(replicas[0].group.everywhere(Call("control", ("add", "m"), "n:m", model="m")))
        await applied.wait()
        assert replicas[0].group.changed("m")  # loaded here; the supervisor has not heard back from replica 1
        assert not replicas[0].group.changed("other") and not replicas[1].group.changed("m")
        release.set()
        assert await call == "m"
        await asyncio.sleep(0.05)
        assert replicas[0].group.view.changing is None and not replicas[0].group.changed("m")
        for task in readers:
            task.cancel()

    asyncio.run(run())


# ---- CPUs for --workers auto ---------------------------------------------------------------------


def test_cgroup_quota_v2_v1_and_none(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    (tmp_path / "pod").mkdir()
    proc.write_text("0::/pod\n")
    (tmp_path / "pod" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path, proc) == 1.5
    assert usable_cpus(tmp_path, proc) == min(2, usable_cpus(tmp_path / "none", proc))
    (tmp_path / "pod" / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path, proc) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "kube").mkdir(parents=True)
    proc.write_text("4:cpu,cpuacct:/kube\n")
    (v1 / "cpu,cpuacct" / "kube" / "cpu.cfs_quota_us").write_text("250000")
    (v1 / "cpu,cpuacct" / "kube" / "cpu.cfs_period_us").write_text("100000")
    assert math.isclose(cgroup_quota(v1, proc) or 0, 2.5)
    (v1 / "cpu,cpuacct" / "kube" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_quota(v1, proc) is None
    assert usable_cpus(tmp_path / "nothing", tmp_path / "missing") >= 1
