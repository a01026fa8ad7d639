"""Per-version inference statistics with Triton's counters (``extension_statistics.md``).

Durations are cumulative nanoseconds with counts. ``inference_count`` counts batch elements,
``execution_count`` model executions; ``last_inference`` is ms since the epoch. A decoupled model's
responses are also counted by their index in their request (``response_stats``: "0" for every
first response, "1" for every second, ...). Updated from the event loop thread only, so no lock
is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kserve_v2._proto import grpc_service_pb2 as pb


@dataclass(slots=True)
class RequestReport:
    """One successful request as statistics, metrics and the transports see it.

    Attributes:
        batch_size: the request's batch size (its batch elements).
        executions: model executions it accounts for (1, or 0 for the second and later members of
            a merged batch).
        execution_batch: rows (or texts) of the execution it came from; 0: its own batch size.
        total_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns: where its time
            went (ns, the phases of ModelStatistics).
        tokens: the tokens a text model processed for it (0 for tensor models).
        trace_id: its trace id, when traced.
        outputs: the output arrays, when the caller takes them instead of raw contents.

    Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, which costs
    microseconds per request; callers only read it.
    """

    batch_size: int
    executions: int
    execution_batch: int
    total_ns: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    tokens: int = 0
    trace_id: str | None = None
    outputs: tuple[np.ndarray, ...] = ()


@dataclass(slots=True)
class Duration:
    """A count and a cumulative duration in ns."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def to_pb(self, out: pb.StatisticDuration) -> None:
        out.count, out.ns = self.count, self.ns


@dataclass(slots=True)
class Phases:
    """Time spent decoding inputs, running the model and encoding outputs (ns)."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStats:
    """The responses sent at one index of their requests (Triton's ``InferResponseStatistics``):
    ``compute_infer`` the time since the previous response (or the request's start), ``compute_output``
    the time to write the response; ``success``, ``fail`` and ``empty_response`` (a final flag sent
    alone) by outcome, each with the sum of both."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def to_pb(self, out: pb.InferResponseStatistics) -> None:
        for name in ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"):
            getattr(self, name).to_pb(getattr(out, name))


@dataclass(slots=True)
class ModelStats:
    """Counters of one model version."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    phases: Phases = field(default_factory=Phases)
    by_batch: dict[int, Phases] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    responses: dict[str, ResponseStats] = field(default_factory=dict)
    cache_hit: Duration = field(default_factory=Duration)  # the response cache's (kserve_v2.service.response_cache)
    cache_miss: Duration = field(default_factory=Duration)

    def record_cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None:
        """Account one request answered from the response cache, as Triton's ``UpdateSuccessCacheHit``: a
        success with its queue time (hashing the request) and the lookup's ``hit_ns``; no inference,
        execution or compute phase (so ``compute_*`` counts are the successes less the hits)."""
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(hit_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """Account the lookup and insertion time of a request the model answered (``UpdateSuccessCacheMiss``;
        the request itself is ``record_success``'s, its total already including this time)."""
        self.cache_miss.add(miss_ns)

    def record_success(self, report: RequestReport) -> None:
        """Account one successful request: its batch elements, the model executions it accounts
        for, and its phases.

        ``batch_stats`` count executions by their real batch size (Triton's
        ``extension_statistics.md``): the execution's rows, or the request's own size; a request
        that shares another's execution adds nothing there.
        """
        # attribute updates inline: this runs once per request (a method call per counter costs more)
        success, queue, phases = self.success, self.queue, self.phases
        input_ns, infer_ns, output_ns = report.compute_input_ns, report.compute_infer_ns, report.compute_output_ns
        success.count += 1
        success.ns += report.total_ns
        queue.count += 1
        queue.ns += report.queue_ns
        _add_phases(phases, input_ns, infer_ns, output_ns)
        if report.executions:
            size = report.execution_batch or report.batch_size
            batch = self.by_batch.get(size)
            if batch is None:  # not setdefault: that would build a Phases per request
                batch = self.by_batch[size] = Phases()
            _add_phases(batch, input_ns, infer_ns, output_ns)
        self.inference_count += report.batch_size
        self.execution_count += report.executions
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_failure(self, total_ns: int) -> None:
        """Account one failed request."""
        self.fail.add(total_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_response(self, index: int, outcome: str, infer_ns: int, output_ns: int) -> None:
        """Account one response of a decoupled model: its ``index`` in its request, its ``outcome``
        (``success``, ``fail`` or ``empty_response``, as Triton's ``UpdateResponse*`` name them)."""
        stats = self.responses.get(str(index))
        if stats is None:
            stats = self.responses[str(index)] = ResponseStats()
        stats.compute_infer.add(infer_ns)
        if outcome == "success":
            stats.compute_output.add(output_ns)
        getattr(stats, outcome).add(infer_ns + output_ns)

    def to_pb(self, name: str, version: int) -> pb.ModelStatistics:
        """Render as the ModelStatistics message."""
        out = pb.ModelStatistics(
            name=name,
            version=str(version),
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
        )
        stats = out.inference_stats
        self.success.to_pb(stats.success)
        self.fail.to_pb(stats.fail)
        self.queue.to_pb(stats.queue)
        self.phases.compute_input.to_pb(stats.compute_input)
        self.phases.compute_infer.to_pb(stats.compute_infer)
        self.phases.compute_output.to_pb(stats.compute_output)
        stats.cache_hit.SetInParent()
        stats.cache_miss.SetInParent()
        self.cache_hit.to_pb(stats.cache_hit)
        self.cache_miss.to_pb(stats.cache_miss)
        for size in sorted(self.by_batch):
            phases = self.by_batch[size]
            entry = out.batch_stats.add(batch_size=size)
            phases.compute_input.to_pb(entry.compute_input)
            phases.compute_infer.to_pb(entry.compute_infer)
            phases.compute_output.to_pb(entry.compute_output)
        for key, response in self.responses.items():
            response.to_pb(out.response_stats[key])
        return out


def _add_phases(phases: Phases, input_ns: int, infer_ns: int, output_ns: int) -> None:
    compute_input, compute_infer, compute_output = phases.compute_input, phases.compute_infer, phases.compute_output
    compute_input.count += 1
    compute_input.ns += input_ns
    compute_infer.count += 1
    compute_infer.ns += infer_ns
    compute_output.count += 1
    compute_output.ns += output_ns
