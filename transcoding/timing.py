"""SIE's timing headers, shared by the V2 and semantic HTTP routes."""

from __future__ import annotations

from kserve_v2.service import RequestReport


def timing_headers(timing: RequestReport, total_ns: int) -> dict[str, str]:
    """SIE's timing headers in ms (``sie-http-api.txt``): total time of the HTTP request, and the
    phases the core measured - queue (waiting for an instance), tokenization (decoding the request
    into tensors, and a text model's tokenizer), inference (the model) and postprocessing (encoding outputs, only when > 0)."""
    headers = {"X-Total-Time": f"{total_ns / 1e6:.3f}", "X-Queue-Time": f"{timing.queue_ns / 1e6:.3f}",
               "X-Tokenization-Time": f"{timing.compute_input_ns / 1e6:.3f}",
               "X-Inference-Time": f"{timing.compute_infer_ns / 1e6:.3f}"}
    if timing.compute_output_ns > 0:
        headers["X-Postprocessing-Time"] = f"{timing.compute_output_ns / 1e6:.3f}"
    return headers
