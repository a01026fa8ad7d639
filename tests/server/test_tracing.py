"""OpenTelemetry: a traceparent sent in comes back in X-Trace-ID and in the spans the server exports.

The test is the OTLP/HTTP collector (the ``collector`` fixture of conftest.py): it receives the
server's ExportTraceServiceRequest messages and decodes them with opentelemetry-proto.
"""

from __future__ import annotations


import numpy as np
import tritonclient.grpc as grpcclient

from helpers import EXAMPLES, http_request, start_server, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
GRPC_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def test_traceparent_joins_the_callers_trace_over_http_and_grpc(collector, tmp_path) -> None:
    endpoint, spans = collector
    server = start_server(EXAMPLES, tmp_path, "--trace-otlp-endpoint", endpoint)
    try:
        body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
                           for n in ("INPUT0", "INPUT1")]}
        reply = http_request(server, "/v2/models/simple/infer", body=body,
                             headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        assert reply.status_code == 200 and reply.headers["X-Trace-ID"] == TRACE_ID
        reply = http_request(server, "/v2/models/simple/infer", body=body)
        fresh = reply.headers["X-Trace-ID"]  # no traceparent: a new trace
        assert reply.status_code == 200 and len(fresh) == 32 and fresh != TRACE_ID
        with grpcclient.InferenceServerClient(server.url) as client:
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            client.infer("simple", inputs, headers={"traceparent": f"00-{GRPC_TRACE_ID}-{PARENT_ID}-01"})
        wait_until(lambda: {s.trace_id.hex() for s in spans} >= {TRACE_ID, GRPC_TRACE_ID}, "both traces exported", 30)
    finally:
        assert server.stop() == 0
    for trace_id in (TRACE_ID, GRPC_TRACE_ID):
        in_trace = [s for s in spans if s.trace_id.hex() == trace_id]
        root = [s for s in in_trace if s.name == "ModelInfer"]
        assert len(root) == 1, [s.name for s in in_trace]
        assert root[0].parent_span_id.hex() == PARENT_ID
        children = {s.name: s for s in in_trace if s.parent_span_id == root[0].span_id}
        assert set(children) == {"compute_input", "queue", "compute_infer", "compute_output"}
        assert all(c.end_time_unix_nano >= c.start_time_unix_nano for c in children.values())
        assert root[0].start_time_unix_nano <= children["compute_input"].start_time_unix_nano
        attributes = {a.key: a.value.string_value for a in root[0].attributes}
        assert attributes["model.name"] == "simple"


def test_trace_settings_pick_the_traced_requests(collector, tmp_path) -> None:
    """Triton's trace settings: one request in trace_rate, and no more than trace_count traces."""
    import tritonclient.http as httpclient

    endpoint, spans = collector
    server = start_server(EXAMPLES, tmp_path, "--trace-otlp-endpoint", endpoint)
    try:
        with grpcclient.InferenceServerClient(server.url) as client, \
                httpclient.InferenceServerClient(server.http_url) as http:
            assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]  # an endpoint: every request
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            http.update_trace_settings(settings={"trace_rate": "2"})
            for _ in range(4):
                client.infer("simple", inputs)
            http.update_trace_settings(settings={"trace_rate": "1", "trace_count": "1"})
            for _ in range(3):
                client.infer("simple", inputs)
            assert http.get_trace_settings()["trace_count"] == "0"
            http.update_trace_settings(model_name="simple_int8", settings={"trace_level": ["OFF"]})
            assert http.get_trace_settings(model_name="simple_int8")["trace_level"] == ["OFF"]
    finally:
        assert server.stop() == 0  # the exporter flushes on exit
    assert len([s for s in spans if s.name == "ModelInfer"]) == 2 + 1


def test_ensemble_steps_are_child_spans_of_the_ensemble_request(collector, tmp_path) -> None:
    endpoint, spans = collector
    server = start_server(EXAMPLES, tmp_path, "--trace-otlp-endpoint", endpoint)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
            client.infer("simple_ensemble", inputs, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    finally:
        assert server.stop() == 0
    requests = {[a.value.string_value for a in s.attributes if a.key == "model.name"][0]: s
                for s in spans if s.name == "ModelInfer" and s.trace_id.hex() == TRACE_ID}
    assert set(requests) == {"simple_ensemble", "preprocess_round", "simple"}
    assert requests["simple_ensemble"].parent_span_id.hex() == PARENT_ID
    for step in ("preprocess_round", "simple"):
        assert requests[step].parent_span_id == requests["simple_ensemble"].span_id


def test_the_standard_otlp_variable_turns_tracing_on_without_the_flag(collector, tmp_path) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT in place of --trace-otlp-endpoint: spans reach that collector."""
    endpoint, spans = collector
    server = start_server(EXAMPLES, tmp_path, env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint})
    try:
        assert f"tracing: exporting spans over OTLP/HTTP to {endpoint}" in server.log()
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.get_trace_settings().settings["trace_level"].value == ["TIMESTAMPS"]
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            client.infer("simple", inputs, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        wait_until(lambda: any(s.trace_id.hex() == TRACE_ID and s.name == "ModelInfer" for s in spans),
                   "the request's span at the collector", 30)
    finally:
        assert server.stop() == 0
