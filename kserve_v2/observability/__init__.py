"""What the server tells about itself: Prometheus metrics (inference, CPU, GPU, latency
summaries), request traces (OpenTelemetry or Triton's trace file), log settings, and the status
object of ``/ws/status``."""
