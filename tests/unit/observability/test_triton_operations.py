"""Triton's --metrics-config and --trace-config parsing, the trace settings' rules and Triton's trace
file, with no server (Triton's docs/user_guide/metrics.md, trace.md and qa/L0_trace)."""

from __future__ import annotations

import json

import pytest

from kserve_v2.observability.trace_file import TraceFile, tensor_entry
from kserve_v2.observability.trace_settings import TraceSettings
from kserve_v2.protocol.errors import InvalidInput, Unsupported
from kserve_v2.settings.metrics_config import DEFAULT_QUANTILES, MetricsConfig, parse_metrics_config
from kserve_v2.settings.trace_config import DEFAULT_OTLP_URL, TraceConfig, parse_trace_config


def test_metrics_config_keys() -> None:
    assert parse_metrics_config([]) == MetricsConfig(True, False, False, DEFAULT_QUANTILES, 60.0)
    config = parse_metrics_config(["summary_latencies=true", "counter_latencies=false", "histogram_latencies=true",
                                   "summary_quantiles=0.5:0.05,0.9:0.01", "summary_max_age=2.5"])
    assert config == MetricsConfig(False, True, True, ((0.5, 0.05), (0.9, 0.01)), 2.5)


@pytest.mark.parametrize("setting, text", [
    ("summary_latencies", "option format is <setting>=<value>"),
    ("model,summary_latencies=true", "option format is <setting>=<value>"),
    ("summary_latencies=yes", "must be true or false"),
    ("summary_quantiles=0.5", "invalid pair '0.5'"),
    ("summary_quantiles=1.5:0.01", "invalid pair '1.5:0.01'"),
    ("summary_max_age=0", "must be a number of seconds > 0"),
    ("cache_latencies=true", "unknown --metrics-config setting 'cache_latencies'"),
])
def test_metrics_config_errors(setting: str, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        parse_metrics_config([setting])


def test_trace_config_modes_and_defaults() -> None:
    assert parse_trace_config([]) == TraceConfig()  # Triton's: mode triton, OFF, rate 1000, no file
    triton = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100", "level=TIMESTAMPS",
                                 "level=TENSORS", "count=7"])
    assert (triton.mode, triton.level, triton.rate, triton.count, triton.file, triton.log_frequency) == (
        "triton", ("TIMESTAMPS", "TENSORS"), 100, 7, "/tmp/t.json", 50)
    assert parse_trace_config(["level=tensors", "level=off"]).level == ("OFF",)  # OFF anywhere wins
    # an OTLP endpoint picks opentelemetry and traces every request from the start
    otel = parse_trace_config([], "http://collector:4318/v1/traces")
    assert (otel.mode, otel.level, otel.rate, otel.url) == ("opentelemetry", ("TIMESTAMPS",), 1, "http://collector:4318/v1/traces")
    otel = parse_trace_config(["mode=opentelemetry", "rate=5", "opentelemetry,resource=service.name=x",
                               "opentelemetry,bsp_schedule_delay=0"])
    assert (otel.url, otel.level, otel.rate, otel.resource, otel.bsp) == (  # Triton's defaults: level OFF
        DEFAULT_OTLP_URL, ("OFF",), 5, (("service.name", "x"),), (("bsp_schedule_delay", 0),))
    otel = parse_trace_config(["mode=opentelemetry", "opentelemetry,url=localhost:4318/v1/traces", "level=TIMESTAMPS"])
    assert (otel.url, otel.level) == ("http://localhost:4318/v1/traces", ("TIMESTAMPS",))
    assert parse_trace_config(["opentelemetry,url=localhost:4318/v1/traces"]).mode == "triton"  # as in Triton
    explicit = parse_trace_config(["mode=triton", "triton,file=t.json"], "http://collector:4318/v1/traces")
    assert (explicit.mode, explicit.url) == ("triton", "")


@pytest.mark.parametrize("entry, text", [
    ("level=LOUD", "invalid value for trace level option: LOUD"),
    ("mode=jaeger", "invalid value for trace mode option: jaeger"),
    (",rate=1", "No trace mode specified"),
    ("rate", "option format is '<trace mode>,<setting>=<value>'"),
    ("rate=-1", "out of range"),
    ("count=x", "is not an integer"),
    ("triton,url=x", "unknown --trace-config setting 'url' for mode 'triton'"),
    ("opentelemetry,resource=novalue", "expects <key>=<value>"),
])
def test_trace_config_errors(entry: str, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        parse_trace_config([entry])


def _settings(tmp_path, **values) -> TraceSettings:
    config = TraceConfig(file=str(tmp_path / "trace.json"), level=("TIMESTAMPS",), **{"rate": 1, **values})
    return TraceSettings(config, TraceFile(tmp_path / "trace.json"))


def test_trace_settings_follow_the_global_ones_as_triton_clears_them(tmp_path) -> None:
    """qa/L0_trace trace_endpoint_test.py test_http_clear_settings, step by step."""
    settings = _settings(tmp_path)
    start = {"trace_level": ("TIMESTAMPS",), "trace_rate": "1", "trace_count": "-1", "log_frequency": "0",
             "trace_file": str(tmp_path / "trace.json"), "trace_mode": "triton"}
    assert settings.current("") == settings.current("simple") == start
    settings.update("simple", {"trace_rate": ["12"], "log_frequency": ["34"]})
    settings.update("", {"trace_rate": ["56"], "trace_count": ["78"], "trace_level": ["OFF"]})
    settings.update("", {"trace_rate": [], "trace_count": []})
    assert settings.current("") == {**start, "trace_level": ("OFF",)}
    assert settings.current("simple") == {**start, "trace_level": ("OFF",), "trace_rate": "12", "log_frequency": "34"}
    settings.update("simple", {"trace_rate": [], "trace_level": []})
    assert settings.current("simple") == {**start, "trace_level": ("OFF",), "log_frequency": "34"}
    settings.update("simple", {"log_frequency": []})  # nothing of its own left: the global settings again
    assert settings.current("simple") == settings.current("")
    with pytest.raises(Unsupported, match="trace file location can not be updated through network protocol"):
        settings.update("simple", {"trace_file": ["other.json"]})
    with pytest.raises(InvalidInput, match="Unable to parse 'trace_rate', value is out of range"):
        settings.update("simple", {"trace_rate": ["10000000000"]})


def test_sampling_counts_down_and_writes_the_counted_traces_to_a_numbered_file(tmp_path) -> None:
    settings = _settings(tmp_path, count=2)
    taken = [settings.sample("simple") for _ in range(3)]
    assert [t is not None for t in taken] == [True, True, False]
    assert settings.current("")["trace_count"] == "0"
    for number, setting in enumerate(taken[:2]):
        assert setting is not None
        settings.collect(setting, [{"id": number + 1, "model_name": "simple", "model_version": 1}])
    assert json.loads((tmp_path / "trace.json.0").read_text()) == [
        {"id": 1, "model_name": "simple", "model_version": 1}, {"id": 2, "model_name": "simple", "model_version": 1}]
    assert not (tmp_path / "trace.json").exists()


def test_rate_log_frequency_and_the_trace_file_stays_valid_json(tmp_path) -> None:
    settings = _settings(tmp_path, rate=2)
    assert [settings.sample("m") is not None for _ in range(4)] == [False, True, False, True]
    setting = settings.sample("m") or settings.sample("m")
    assert setting is not None
    for number in range(3):  # count -1, log_frequency 0: each trace goes to the trace file at once
        settings.collect(setting, [{"id": number}])
        assert json.loads((tmp_path / "trace.json").read_text()) == [{"id": n} for n in range(number + 1)]
    settings.update("", {"log_frequency": ["2"]})
    setting = settings.sample("m") or settings.sample("m")
    assert setting is not None
    for number in (10, 11, 12):
        settings.collect(setting, [{"id": number}])
    assert json.loads((tmp_path / "trace.json.0").read_text()) == [{"id": 10}, {"id": 11}]
    settings.close()  # exit: what is kept goes out, to the next numbered file with a log_frequency
    assert json.loads((tmp_path / "trace.json.1").read_text()) == [{"id": 12}]


def test_no_trace_without_a_file_or_with_level_off(tmp_path) -> None:
    assert TraceSettings(TraceConfig(level=("TIMESTAMPS",), rate=1)).sample("m") is None  # triton mode, no file
    assert _settings(tmp_path, count=-1).sample("m") is not None
    off = _settings(tmp_path)
    off.update("m", {"trace_level": ["OFF"]})
    assert off.sample("m") is None and off.sample("other") is not None


def test_tensor_entries_in_tritons_form() -> None:
    import numpy as np

    assert tensor_entry(3, "TENSOR_QUEUE_INPUT", "x", "FP32", np.array([[0.5, 1.0]], np.float32)) == {
        "id": 3, "activity": "TENSOR_QUEUE_INPUT",
        "tensor": {"name": "x", "data": "0.5,1", "shape": "1,2", "dtype": "FP32"}}
    assert tensor_entry(1, "TENSOR_BACKEND_OUTPUT", "s", "BYTES", np.array([b"a", b"b c"], object))["tensor"]["data"] == '"a","b c"'
    assert tensor_entry(1, "TENSOR_BACKEND_OUTPUT", "b", "BOOL", np.array([True, False]))["tensor"]["data"] == "1,0"
    assert tensor_entry(1, "TENSOR_BACKEND_OUTPUT", "h", "FP16", np.zeros(2, np.float16))["tensor"]["data"] == ""


def test_window_quantiles_slide_with_the_clock() -> None:
    import math

    import numpy as np

    from kserve_v2.observability.summaries import MAX_KEPT, WindowQuantiles

    now = [0.0]
    window = WindowQuantiles(10.0, 5, clock=lambda: now[0])  # slots of 2 s
    window.observe(np.arange(1, 101, dtype=np.float64))
    assert window.query([0.5, 0.9, 0.99]) == [50.0, 90.0, 99.0]  # observed values, exact
    now[0] = 8.5
    window.observe(np.array([1000.0]))
    assert window.query([0.5])[0] == 51.0 and window.query([0.999])[0] == 1000.0
    now[0] = 10.1  # the first slot has left the window; the last value has not
    assert window.query([0.5, 0.9]) == [1000.0, 1000.0]
    now[0] = 100.0
    assert all(math.isnan(value) for value in window.query([0.5, 0.9]))
    assert (window.count, window.sum) == (101, 5050.0 + 1000.0)  # _count and _sum keep everything
    window.observe(np.linspace(0.0, 1.0, 4 * MAX_KEPT))  # more than a slot keeps: a uniform sample
    assert abs(window.query([0.5])[0] - 0.5) < 0.05 and window.count == 101 + 4 * MAX_KEPT
