"""One server's answers from N replicas' (``--workers N``): statistics, repository index, Prometheus
families and the status object, each merged from what every replica answered for itself.

Counts and durations add up; a model's index rows are those of a replica where it is not READY
(when replicas differ, a load or unload is under way there); metric families keep today's names
and labels, their samples added up, except the readings of the host or of the group, which every
replica reads alike (CPU and GPU gauges, ``process_max_fds``, the replica gauges: the largest), the
start time (the earliest) and a model's loaded gauge (the smallest: loaded only when loaded on
every replica). A summary's quantiles cannot be added: the merged series carries the largest of the
replicas' (an upper bound of the server's), its ``_count`` and ``_sum`` exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from prometheus_client.core import Metric

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.models.lifecycle import READY
from kserve_v2.workers.replicas import Outcome

# repeated statistics messages, matched between replicas by these fields
_STAT_KEYS = {"batch_stats": ("batch_size",), "memory_usage": ("type", "id")}
_LATEST = {"last_inference"}  # ms since the epoch: the latest, not the sum
_HIGHEST = ("nv_cpu_", "nv_gpu_", "process_max_fds", "kserve_v2_replica")  # name prefixes read alike everywhere
_LOWEST = ("process_start_time_seconds", "sie_model_loaded")
_STATUS_SUMS = ("memory_bytes", "queue_depth", "queue_pending_items")


def values(outcomes: Sequence[Outcome]) -> list[Any]:
    """The values of the replicas that answered; when none did, the first error is raised."""
    answered = [o.value for o in outcomes if o.error is None]
    if not answered:
        for outcome in outcomes:
            outcome.result()
    return answered


# ---- ModelStatistics -------------------------------------------------------------------------

def merge_statistics(responses: Sequence[pb.ModelStatisticsResponse]) -> pb.ModelStatisticsResponse:
    """Every replica's ModelStatistics added up per (model, version), in the order first seen."""
    merged = pb.ModelStatisticsResponse()
    rows: dict[tuple[str, str], pb.ModelStatistics] = {}
    for response in responses:
        for stats in response.model_stats:
            row = rows.get((stats.name, stats.version))
            if row is None:
                rows[(stats.name, stats.version)] = merged.model_stats.add()
                rows[(stats.name, stats.version)].CopyFrom(stats)
            else:
                _add(row, stats)
    return merged


def _add(into: Message, other: Message, keys: tuple[str, ...] = ()) -> None:
    """Add ``other``'s numbers to ``into``'s (the same message type): counts and durations sum,
    ``last_inference`` takes the latest, repeated entries and map values match by their keys
    (``keys``: the fields that matched them, kept as they are)."""
    for field, value in other.ListFields():
        target = getattr(into, field.name)
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            if field.name not in keys and not field.is_repeated and isinstance(value, int | float) and not isinstance(
                    value, bool):
                setattr(into, field.name, max(target, value) if field.name in _LATEST else target + value)
        elif field.message_type.GetOptions().map_entry:
            for key, entry in value.items():
                _add(target[key], entry)
        elif field.is_repeated:
            names = _STAT_KEYS.get(field.name, ())
            known = {tuple(getattr(e, n) for n in names): e for e in target}
            for entry in value:
                match = known.get(tuple(getattr(entry, n) for n in names)) if names else None
                if match is None:
                    target.add().CopyFrom(entry)
                else:
                    _add(match, entry, names)
        else:
            _add(target, value)


# ---- RepositoryIndex -------------------------------------------------------------------------

def merge_index(responses: Sequence[pb.RepositoryIndexResponse], ready_only: bool) -> pb.RepositoryIndexResponse:
    """The index as one server: a model's rows are every replica's where they agree, else those of
    the first replica where the model is not READY on every version; ``ready_only`` then keeps the
    READY rows (Triton's ``ready`` filter)."""
    per_model: dict[str, list[list[pb.RepositoryIndexResponse.ModelIndex]]] = {}
    for response in responses:
        rows: dict[str, list[pb.RepositoryIndexResponse.ModelIndex]] = {}
        for row in response.models:
            rows.setdefault(row.name, []).append(row)
        for name, model_rows in rows.items():
            per_model.setdefault(name, []).append(model_rows)
    merged = pb.RepositoryIndexResponse()
    for name in sorted(per_model):
        views = per_model[name]
        if len(views) < len(responses):
            views = views + [[pb.RepositoryIndexResponse.ModelIndex(name=name)]]  # a replica that has no record of it
        chosen = views[0]
        if any(view != chosen for view in views):
            chosen = next((view for view in views if not all(r.state == READY for r in view)), chosen)
        merged.models.extend(row for row in chosen if not ready_only or row.state == READY)
    return merged


# ---- Prometheus families ---------------------------------------------------------------------

def merge_families(replicas: Sequence[Iterable[Metric]]) -> list[Metric]:
    """Each family once, with today's names, types and labels; a sample's value combined over the
    replicas (see the module docstring), in the order first seen."""
    families: dict[str, Metric] = {}
    values_by_family: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Any]] = {}
    for collected in replicas:
        for family in collected:
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values_by_family[family.name] = {}
            combine = _combiner(family)
            samples = values_by_family[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                known = samples.get(key)
                samples[key] = sample if known is None else known._replace(
                    value=(max if "quantile" in sample.labels else combine)(known.value, sample.value))
    for name, family in families.items():
        family.samples = list(values_by_family[name].values())
    return list(families.values())


def _combiner(family: Metric) -> Callable[[float, float], float]:
    if family.name.startswith(_HIGHEST):
        return max
    if family.name.startswith(_LOWEST):
        return min
    return _sum


def _sum(a: float, b: float) -> float:
    return a + b


# ---- the status object (/ws/status) -----------------------------------------------------------

def merge_status(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every replica's status object as one: models matched by name (memory and queues added up,
    the state of a replica where the model is not loaded when they differ), counters and
    histograms added up per labels, the longest uptime."""
    merged = dict(snapshots[0])
    models: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for model in snapshot["models"]:
            known = models.get(model["name"])
            if known is None:
                models[model["name"]] = dict(model)
                continue
            for key in _STATUS_SUMS:
                known[key] = known[key] + model[key]
            if model["state"] != known["state"] and known["state"] == "loaded":
                known["state"], known["versions"] = model["state"], model["versions"]
    merged["models"] = list(models.values())
    merged["loaded_models"] = [m["name"] for m in merged["models"] if m["state"] == "loaded"]
    merged["server"] = dict(merged["server"], uptime_seconds=max(s["server"]["uptime_seconds"] for s in snapshots))
    merged["counters"] = _merge_series([s["counters"] for s in snapshots], ("value",))
    merged["histograms"] = _merge_series([s["histograms"] for s in snapshots], ("count", "sum"), "buckets")
    return merged


def _merge_series(per_replica: Sequence[dict[str, list[dict[str, Any]]]], numbers: tuple[str, ...],
                  nested: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Series ``{family: [{"labels": {...}, number: value, nested: {key: value}}]}`` added up per labels."""
    merged: dict[str, dict[tuple[tuple[str, str], ...], dict[str, Any]]] = {}
    for families in per_replica:
        for name, series in families.items():
            entries = merged.setdefault(name, {})
            for entry in series:
                key = tuple(sorted(entry["labels"].items()))
                known = entries.get(key)
                if known is None:
                    entries[key] = {**entry, **({nested: dict(entry[nested])} if nested else {})}
                    continue
                for number in numbers:
                    if number in entry:
                        known[number] = known.get(number, 0) + entry[number]
                if nested:
                    for bucket, value in entry[nested].items():
                        known[nested][bucket] = known[nested].get(bucket, 0) + value
    return {name: list(entries.values()) for name, entries in merged.items()}
