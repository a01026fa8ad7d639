"""What the server tells about itself: Prometheus metrics, request traces, log settings, and the
status object of ``/ws/status``.

- ``metrics``: Triton's inference metric families, and per-API totals for other exporters.
- ``cpu_metrics``: Triton's CPU metric families, read with psutil.
- ``gpu``: GPU readings through NVML: Triton's GPU metric families and the status GPU list.
- ``summaries``: latency summaries whose quantiles cover a sliding time window.
- ``tracing``: request tracing: OpenTelemetry spans, or Triton's trace records.
- ``trace_file``: Triton's JSON trace file.
- ``trace_settings``: Triton's trace extension: the settings, global and per model, that pick the traced requests.
- ``log_settings``: Triton's logging extension: what the server logs, changed while it runs.
- ``status``: the status object of SIE's ``/ws/status``, transport-free.
"""
