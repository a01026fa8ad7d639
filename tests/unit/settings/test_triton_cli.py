"""Triton 2.51's whole command line: every option spelling of its ``src/command_line_parser.cc``
(``tritonserver --help``) is accepted by ``kserve-v2 serve`` with Triton's value syntax, and either
sets a setting or logs one start-up warning that names it (``kserve_v2.cli.TRITON_WARNED``).

The list is written out here (CI has no Triton checkout): the 87 ``{OPTION_..., "<name>", ...}``
entries of Triton v2.51.0's ``SetupOptions``, in its order.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from functools import reduce
from pathlib import Path

import pytest

from kserve_v2.cli import TRITON_FIXED, TRITON_WARNED, parse_settings
from kserve_v2.observability.log_settings import LogSettings, TritonFormatter
from kserve_v2.repository.config import config_file
from kserve_v2.settings.server import Settings

WARN = "warn"  # the option logs a start-up warning naming it
FIXED = "fixed"  # Triton's switch for what this server always (or never) does: that value only
# spelling -> (value, or None for an option without one; the setting it changes (a dotted path), WARN or FIXED)
TRITON_251: dict[str, tuple[str | None, str]] = {
    "help": (None, "help"),
    "id": ("my-server", "server_name"),
    "exit-timeout-secs": ("7", "exit_timeout_secs"),
    "model-store": ("{other}", "model_repositories"),
    "model-repository": ("{other}", "model_repositories"),
    "exit-on-error": ("false", "exit_on_error"),
    "disable-auto-complete-config": (None, "model_load.auto_complete"),
    "strict-readiness": ("false", "strict_readiness"),
    "model-control-mode": ("poll", "model_control_mode"),
    "repository-poll-secs": ("3", "repository_poll_secs"),
    "load-model": ("simple", "load_models"),
    "model-config-name": ("h100", "model_load.config_name"),
    "model-load-thread-count": ("2", "model_load_thread_count"),
    "model-load-retry-count": ("2", "model_load.retry_count"),
    "model-namespacing": ("false", FIXED),
    "enable-peer-access": ("false", WARN),
    "allow-http": ("false", "allow_http"),
    "http-address": ("127.0.0.1", "http_address"),
    "http-port": ("9000", "http_port"),
    "reuse-http-port": ("true", "reuse_http_port"),
    "http-header-forward-pattern": ("x-.*", "http.header_forward_pattern"),
    "http-thread-count": ("8", WARN),
    "http-restricted-api": ("model-repository:admin-key=secret", "http.restricted_api"),
    "allow-grpc": ("true", FIXED),
    "grpc-address": ("127.0.0.1", "grpc_address"),
    "grpc-port": ("9001", "grpc_port"),
    "reuse-grpc-port": ("true", "grpc.reuse_port"),
    "grpc-header-forward-pattern": ("x-.*", "grpc.header_forward_pattern"),
    "grpc-infer-allocation-pool-size": ("16", WARN),
    "grpc-use-ssl": ("true", "grpc.tls.use_ssl"),
    "grpc-use-ssl-mutual": ("true", "grpc.tls.mutual"),
    "grpc-server-cert": ("{pem}", "grpc.tls.server_cert"),
    "grpc-server-key": ("{pem}", "grpc.tls.server_key"),
    "grpc-root-cert": ("{pem}", "grpc.tls.root_cert"),
    "grpc-infer-response-compression-level": ("high", "grpc.compression_level"),
    "grpc-keepalive-time": ("1000", "grpc.keepalive_time"),
    "grpc-keepalive-timeout": ("1000", "grpc.keepalive_timeout"),
    "grpc-keepalive-permit-without-calls": ("1", "grpc.keepalive_permit_without_calls"),
    "grpc-http2-max-pings-without-data": ("5", "grpc.http2_max_pings_without_data"),
    "grpc-http2-min-recv-ping-interval-without-data": ("1000", "grpc.http2_min_recv_ping_interval_without_data"),
    "grpc-http2-max-ping-strikes": ("5", "grpc.http2_max_ping_strikes"),
    "grpc-max-connection-age": ("60000", "grpc.max_connection_age"),
    "grpc-max-connection-age-grace": ("5000", "grpc.max_connection_age_grace"),
    "grpc-restricted-protocol": ("health:probe-key=secret", "grpc.restricted_protocol"),
    "log-verbose": ("1", "log_verbose"),
    "log-info": ("false", "log_info"),
    "log-warning": ("false", "log_warning"),
    "log-error": ("false", "log_error"),
    "log-format": ("ISO8601", "log_format"),
    "log-file": ("{log}", "log_file"),
    "allow-sagemaker": ("false", FIXED),
    "sagemaker-port": ("8080", WARN),
    "sagemaker-safe-port-range": ("8000-8100", WARN),
    "sagemaker-thread-count": ("8", WARN),
    "allow-vertex-ai": ("false", FIXED),
    "vertex-ai-port": ("8080", WARN),
    "vertex-ai-thread-count": ("8", WARN),
    "vertex-ai-default-model": ("simple", WARN),
    "allow-metrics": ("false", "allow_metrics"),
    "allow-gpu-metrics": ("false", "allow_gpu_metrics"),
    "allow-cpu-metrics": ("false", "allow_cpu_metrics"),
    "metrics-address": ("127.0.0.1", "metrics_address"),
    "metrics-port": ("9002", "metrics_port"),
    "metrics-interval-ms": ("500", "metrics_interval_ms"),
    "metrics-config": ("summary_latencies=true", "metrics_config"),
    "trace-config": ("level=TIMESTAMPS", "trace_config"),
    "cache-config": ("local,size=1048576", "cache_config"),
    "cache-directory": ("/opt/caches", "cache_directory"),
    "rate-limit": ("execution_count", "rate_limit"),
    "rate-limit-resource": ("R1:4", "rate_limit_resources"),
    "pinned-memory-pool-byte-size": ("268435456", WARN),
    "cuda-memory-pool-byte-size": ("0:67108864", WARN),
    "cuda-virtual-address-size": ("0:1073741824", WARN),
    "min-supported-compute-capability": ("6.0", WARN),
    "buffer-manager-thread-count": ("2", WARN),
    "host-policy": ("gpu_0,numa-node=0", WARN),
    "model-load-gpu-limit": ("0:0.5", WARN),
    "backend-directory": ("/opt/tritonserver/backends", WARN),
    "backend-config": ("python,shm-growth-byte-size=2097152", "backend_config"),
    "repoagent-directory": ("/opt/tritonserver/repoagents", WARN),
    "strict-model-config": ("true", "model_load.auto_complete"),
    "response-cache-byte-size": ("1048576", "cache_config"),
    "trace-file": ("{log}", "trace_config"),
    "trace-level": ("TIMESTAMPS", "trace_config"),
    "trace-rate": ("10", "trace_config"),
    "trace-count": ("5", "trace_config"),
    "trace-log-frequency": ("10", "trace_config"),
}
# what an option needs beside it to be valid (Triton's rules, checked here as there)
NEEDS = {"load-model": ["--model-control-mode=explicit"],
         "grpc-use-ssl": ["--grpc-server-cert={pem}", "--grpc-server-key={pem}"],
         "grpc-use-ssl-mutual": ["--grpc-server-cert={pem}", "--grpc-server-key={pem}", "--grpc-root-cert={pem}"]}
# the warnings an option logs beside its own (Triton's for its deprecated --strict-model-config)
ALSO_WARNS = {"strict-model-config": 1}  # Triton's deprecation warning


def _get(settings: Settings, path: str) -> object:
    return reduce(getattr, path.split("."), settings)


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "repo").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "cert.pem").write_text("PEM")
    return {"repo": str(tmp_path / "repo"), "other": str(tmp_path / "other"), "pem": str(tmp_path / "cert.pem"),
            "log": str(tmp_path / "server.log")}


def _parse(places: dict[str, str], *args: str) -> Settings:
    return parse_settings(["tritonserver", *(a.format(**places) for a in args)]
                          + ([] if any(a.startswith(("--model-store", "--model-repository")) for a in args)
                             else [f"--model-repository={places['repo']}"]))


def test_the_list_is_triton_251s_87_spellings() -> None:
    assert len(TRITON_251) == 87
    assert set(TRITON_WARNED) == {name for name, (_, what) in TRITON_251.items() if what == WARN}
    assert set(TRITON_FIXED) == {name for name, (_, what) in TRITON_251.items() if what == FIXED}


@pytest.mark.parametrize("name", sorted(set(TRITON_251) - {"help"}))
def test_every_spelling_is_accepted_and_acted_on_or_warned(name: str, places: dict[str, str]) -> None:
    value, what = TRITON_251[name]
    needs = NEEDS.get(name, [])
    baseline = _parse(places, *needs)
    forms = [[f"--{name}"]] if value is None else [[f"--{name}={value}"], [f"--{name}", value]]
    parsed = [_parse(places, *needs, *form) for form in forms]
    assert all(p == parsed[0] for p in parsed)  # --flag=value and --flag value alike
    settings = parsed[0]
    warnings = [w for w in settings.warnings if f"--{name} " in w]
    if what == WARN:
        assert len(warnings) == 1 and "has no effect here: " in warnings[0]
        assert replace(settings, warnings=()) == baseline  # nothing else changes
    elif what == FIXED:
        assert settings == baseline  # the one value this server serves with
    else:
        assert _get(settings, what) != _get(baseline, what)
        assert len(settings.warnings) == ALSO_WARNS.get(name, 0)


def test_help_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_settings(["tritonserver", "--help"])
    assert done.value.code == 0
    assert "--log-file" in capsys.readouterr().out


def test_triton_booleans_and_values(places: dict[str, str]) -> None:
    for text, expected in (("true", True), ("1", True), ("ON", True), ("false", False), ("0", False), ("off", False)):
        assert _parse(places, f"--reuse-grpc-port={text}").grpc.reuse_port is expected
    assert _parse(places, "--log-verbose=true").log_verbose == 1  # Triton's ParseIntBoolOption
    assert _parse(places, "--grpc-infer-response-compression-level=MEDIUM").grpc.compression_level == "medium"
    settings = _parse(places, "--disable-auto-complete-config", "--strict-model-config=false")
    assert not settings.model_load.auto_complete
    assert any("Overriding deprecated '--strict-model-config' from False to True" in w for w in settings.warnings)


@pytest.mark.parametrize("args", [["--log-format=iso8601"], ["--model-config-name="], ["--http-thread-count=many"],
                                  ["--cuda-memory-pool-byte-size=67108864"], ["--sagemaker-safe-port-range=8000"],
                                  ["--host-policy=numa-node=0"], ["--grpc-infer-response-compression-level=max"],
                                  ["--log-info=maybe"], ["--model-load-retry-count=-1"], ["--no-such-triton-flag"]])
def test_what_triton_refuses_is_a_usage_error(args: list[str], places: dict[str, str]) -> None:
    with pytest.raises(SystemExit) as done:
        _parse(places, *args)
    assert done.value.code == 2


def test_each_warned_option_warns_once_when_repeated(places: dict[str, str]) -> None:
    settings = _parse(places, "--cuda-memory-pool-byte-size=0:1", "--cuda-memory-pool-byte-size=1:1",
                      "--host-policy=a,numa-node=0", "--host-policy=b,cpu-cores=0-3")
    assert [w.split()[0] for w in settings.warnings] == ["--cuda-memory-pool-byte-size", "--host-policy"]


def test_warned_options_come_from_the_environment_too(places: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSERVE_V2_CUDA_MEMORY_POOL_BYTE_SIZE", "0:1;1:1")
    monkeypatch.setenv("KSERVE_V2_HTTP_THREAD_COUNT", "8")
    monkeypatch.setenv("KSERVE_V2_DISABLE_AUTO_COMPLETE_CONFIG", "true")
    settings = _parse(places)
    assert [w.split()[0] for w in settings.warnings] == ["--http-thread-count", "--cuda-memory-pool-byte-size"]
    assert not settings.model_load.auto_complete


@pytest.mark.parametrize(("layout", "pattern"), [
    # Triton's qa/L0_logging/log_format_test.py regexes
    ("default", r"(?P<level>\w)(?P<month>\d{2})(?P<day>\d{2}) (?P<timestamp>\d{2}:\d{2}:\d{2}\.\d{6}) (?P<pid>\d+) "
                r"(?P<file>[\w\.]+):(?P<line>\d+)] (?P<message>.*)"),
    ("ISO8601", r"(?P<ISO8601_timestamp>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z) (?P<level>\w+) (?P<pid>\d+) "
                r"(?P<file>.+):(?P<line>\d+)] (?P<message>.*)")])
def test_triton_line_layouts(layout: str, pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    record = logging.LogRecord("kserve_v2", logging.WARNING, "/x/app.py", 42, "say %s", ('"hi"\n',), None)
    match = re.fullmatch(pattern, TritonFormatter(layout).format(record))
    assert match is not None
    # JSON-encoded, as Triton escapes messages by default: one line whatever the message holds
    assert (match["level"], match["file"], match["line"], match["message"]) == ("W", "app.py", "42",
                                                                                 '"say \\"hi\\"\\n"')
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    assert TritonFormatter(layout).format(record).endswith('] say "hi"\n')


def test_log_settings_start_from_the_flags() -> None:
    """--log-info/--log-warning/--log-error, --log-format and --log-file as the logging extension answers them."""
    logs = LogSettings(0, (False, True, True), "ISO8601", "/var/log/triton.log")
    assert logs.current() == {"log_file": "/var/log/triton.log", "log_info": False, "log_warning": True,
                              "log_error": True, "log_verbose_level": 0, "log_format": "ISO8601"}
    info = logging.LogRecord("kserve_v2", logging.INFO, "app.py", 1, "hello", (), None)
    assert not logs.filter(info)
    assert LogSettings(0, log_format="json").current()["log_format"] == "default"  # ours answer as Triton's default


def test_the_custom_config_name_picks_configs_name_pbtxt(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "h100.pbtxt").write_text("")
    assert config_file(tmp_path, "h100") == tmp_path / "configs" / "h100.pbtxt"
    assert config_file(tmp_path, "a100") == config_file(tmp_path) == tmp_path / "config.pbtxt"
