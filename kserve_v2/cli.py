"""Command line: ``kserve-v2 serve --model-repository DIR [...]``.

Flag names are Triton's where Triton has one. Every flag can also come from an environment
variable ``KSERVE_V2_<FLAG>`` (``--grpc-port`` -> ``KSERVE_V2_GRPC_PORT``); a flag given on
the command line wins.

Triton's spellings where ours differ are accepted too (``TRITON_ALIASES``), so the arguments of
a Triton container (KServe's ``kserve-tritonserver`` ClusterServingRuntime passes
``tritonserver --model-store=/mnt/models --grpc-port=9000 --http-port=8080 --allow-grpc=true
--allow-http=true``) start this server unchanged after ``kserve-v2``. Source: Triton's
``tritonserver --help`` and KServe's ``config/runtimes/kserve-tritonserver.yaml``. Every option of
Triton 2.51's ``tritonserver`` is accepted: acted on, or (``TRITON_WARNED``: no meaning for this
server) with one start-up warning naming it and saying why (docs/cli.md, "Triton's flags").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import uvloop

from kserve_v2 import __version__
from kserve_v2.host.allocator import huge_page_environment, this_host
from kserve_v2.host.cpus import usable_cpus
from kserve_v2.observability.log_settings import configure_logging
from kserve_v2.repository.remote import repository_argument
from kserve_v2.repository.stores import split_repositories
from kserve_v2.settings.backend_config import parse_backend_config
from kserve_v2.settings.cache_config import parse_cache_config
from kserve_v2.settings.metrics_config import MetricsConfig, parse_metrics_config
from kserve_v2.settings.rate_limit import RATE_LIMIT_MODES, parse_rate_limit_resource
from kserve_v2.settings.restrictions import GROUPS
from kserve_v2.workers.replicas import ReplicaGroup
from kserve_v2.settings.server import (COMPRESSION_LEVELS, CONTROL_MODES, EVENT_LOOPS, LOG_FORMATS, TOKEN_ID_MODES,
                                       GrpcSettings, HttpSettings, ModelLoadSettings, Settings, TlsSettings)
from kserve_v2.settings.trace_config import TraceConfig, parse_trace_config
from kserve_v2.workers.supervisor import Supervisor, reserve_ports

ENV_PREFIX = "KSERVE_V2_"
# Settings fields that are not one flag each: they are built from several flags (see _settings)
_GROUPED = {"model_repositories", "load_models", "metrics_config", "trace_config", "grpc", "http", "rate_limit_resources",
            "cache_config", "backend_config", "model_load", "warnings"}
# Triton's spellings: the `tritonserver` command runs `serve`; `--model-store` is `--model-repository`;
# `--id` is the server's identifier, its ServerMetadata name (`--server-name`).
TRITON_ALIASES = {"serve": ["tritonserver"], "--model-repository": ["--model-store"], "--server-name": ["--id"]}
# Triton's switches for what this server always does (or never does): only that value is accepted.
TRITON_FIXED = {"allow-grpc": (True, "gRPC is this server's primary API (and its health probe)"),
                "allow-sagemaker": (False, "there is no SageMaker API"),
                "allow-vertex-ai": (False, "there is no Vertex AI API"),
                "model-namespacing": (False, "model names form one namespace; a name in two repositories is ambiguous")}


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _pair(first: Callable[[str], object], second: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type for Triton's ``<a>:<b>`` values (``<device>:<bytes>``): checked, kept as given."""
    def check(text: str) -> str:
        head, colon, tail = text.partition(":")
        with contextlib.suppress(ValueError):
            if colon and first(head) is not None and second(tail) is not None:
                return text
        raise argparse.ArgumentTypeError(f"expected <{first.__name__}>:<{second.__name__}>, got '{text}'")
    return check


def _port_range(text: str) -> str:
    """An argparse type for Triton's ``<integer>-<integer>`` (``--sagemaker-safe-port-range``)."""
    low, dash, high = text.partition("-")
    if not dash or not low.isdigit() or not high.isdigit():
        raise argparse.ArgumentTypeError(f"expected <integer>-<integer>, got '{text}'")
    return text


def _setting(text: str) -> str:
    """An argparse type for Triton's ``<name>,<setting>=<value>`` (``--host-policy``)."""
    name, comma, setting = text.partition(",")
    if not comma or not name or "=" not in setting:
        raise argparse.ArgumentTypeError(f"expected <string>,<string>=<string>, got '{text}'")
    return text


# Triton's flags that have no effect here: accepted with their values checked as Triton types them,
# each given one logs one start-up warning naming it and saying why: name -> (type, repeatable, why).
TRITON_WARNED: dict[str, tuple[Callable[[str], object], bool, str]] = {
    "enable-peer-access": (_bool, False,
                           "GPU peer access is ONNX Runtime's (its CUDA provider), not the server's"),
    "http-thread-count": (int, False, "HTTP requests are served on the event loop, not by a thread pool "
                                      "(--workers adds processes)"),
    "grpc-infer-allocation-pool-size": (int, False, "gRPC requests and responses are not pooled for reuse here"),
    "sagemaker-port": (int, False, "there is no SageMaker API"),
    "sagemaker-safe-port-range": (_port_range, False, "there is no SageMaker API"),
    "sagemaker-thread-count": (int, False, "there is no SageMaker API"),
    "vertex-ai-port": (int, False, "there is no Vertex AI API"),
    "vertex-ai-thread-count": (int, False, "there is no Vertex AI API"),
    "vertex-ai-default-model": (str, False, "there is no Vertex AI API"),
    "pinned-memory-pool-byte-size": (int, False, "there is no pinned memory pool: ONNX Runtime copies tensors "
                                                 "to and from its devices"),
    "cuda-memory-pool-byte-size": (_pair(int, int), True, "there is no CUDA memory pool: ONNX Runtime allocates "
                                                          "device memory (its CUDA provider's arena)"),
    "cuda-virtual-address-size": (_pair(int, int), True, "there are no growable implicit state buffers here"),
    "min-supported-compute-capability": (float, False, "ONNX Runtime's CUDA provider decides which GPUs it can use"),
    "buffer-manager-thread-count": (int, False, "tensor contents are copied by the request's own thread; there "
                                                "are no buffer manager threads"),
    "host-policy": (_setting, True, "model instances are not bound to NUMA nodes or CPU cores here"),
    "model-load-gpu-limit": (_pair(int, float), True, "GPU memory use is not checked before a model loads"),
    "backend-directory": (str, False, "the backends (onnxruntime, python) are built in; no backend libraries "
                                      "are loaded"),
    "repoagent-directory": (str, False, "there are no repository agents"),
}
# Triton's texts (command_line_parser.cc) for its deprecated --strict-model-config
STRICT_DEPRECATED = "'--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' instead."
STRICT_OVERRIDDEN = ("Overriding deprecated '--strict-model-config' from False to True in favor of "
                     "'--disable-auto-complete-config'!")


def _verbose(text: str) -> int:
    """Triton's ``--log-verbose``: an integer level, or a boolean (true: 1, false: 0)."""
    try:
        return int(text)
    except ValueError:
        return int(_bool(text))


def _config_name(text: str) -> str:
    """Triton's ``--model-config-name``: refused empty (Settings refuse spaces and path separators)."""
    if not text:
        raise argparse.ArgumentTypeError("Error: empty argument for --model-config-name")  # Triton's text
    return text


def _workers(text: str) -> int:
    if text.strip().lower() == "auto":
        return usable_cpus()
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got '{text}'") from None


def _env(flag: str, default: object) -> object:
    return os.environ.get(ENV_PREFIX + flag.upper().replace("-", "_"), default)


def _parser() -> argparse.ArgumentParser:
    defaults = Settings(model_repositories=())
    parser = argparse.ArgumentParser(prog="kserve-v2", description="KServe V2 / Triton-compatible inference server.")
    parser.add_argument("--version", action="version", version=f"kserve-v2 {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", aliases=TRITON_ALIASES["serve"],
        help="serve a model repository over gRPC and REST ('tritonserver' is an alias)",
        description="Serve a Triton-style model repository over the KServe V2 protocol (gRPC and REST). "
        f"Every flag can also be set with an environment variable {ENV_PREFIX}<FLAG>, e.g. {ENV_PREFIX}GRPC_PORT.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    def flag(name: str, default: object, help_text: str, **kwargs: Any) -> None:  # kwargs: argparse's
        serve.add_argument(f"--{name}", default=_env(name, default), help=help_text, **kwargs)

    repos = os.environ.get(ENV_PREFIX + "MODEL_REPOSITORY")
    serve.add_argument(
        "--model-repository", *TRITON_ALIASES["--model-repository"], action="append", type=repository_argument, default=None,
        metavar="DIR",
        help="model repository folder: <DIR>/<model>/[config.pbtxt] <version>/model.onnx, or s3://, gs:// or as:// "
        "URL (Triton's forms; pip install kserve_v2[s3|gcs|azure]); repeat for several "
        f"(env {ENV_PREFIX}MODEL_REPOSITORY, ':'-separated)" + (f" [env: {repos}]" if repos else ""),
    )
    flag("grpc-address", defaults.grpc_address, "address the gRPC server binds")
    flag("grpc-port", defaults.grpc_port, "gRPC port (0 picks a free one and logs it)", type=int)
    flag("allow-http", defaults.allow_http, "serve the V2 REST API", type=_bool)
    flag("http-address", defaults.http_address, "address the HTTP server binds")
    flag("http-port", defaults.http_port, "HTTP port (0 picks a free one and logs it)", type=int)
    flag("http-max-input-size", defaults.http.max_input_size,
         "largest HTTP request body in bytes, after decompression (larger gets 413)", type=int)
    flag("max-request-decoded-bytes", defaults.max_request_decoded_bytes,
         "most bytes one inference request may hold at its peak, as estimated before decoding (its tensors' "
         "copies, plus per-element costs of BYTES tensors); more gets RESOURCE_EXHAUSTED / 413", type=int)
    flag("request-memory-pool-bytes", defaults.request_memory_pool_bytes,
         "most bytes all inference requests in flight may take together once decoded; a request that does "
         "not fit gets UNAVAILABLE / 503 with Retry-After, as a full queue (it is not queued)", type=int)
    flag("allow-metrics", defaults.allow_metrics,
         "Prometheus metrics at /metrics on the metrics port and the HTTP port", type=_bool)
    flag("allow-client-shm", defaults.allow_client_shm,
         "Triton's system shared memory extension: clients register /dev/shm regions for inputs and outputs "
         "(off by default, as in Triton)", type=_bool)
    flag("metrics-address", defaults.metrics_address, "address the metrics server binds")
    flag("metrics-port", defaults.metrics_port, "metrics port (0 picks a free one and logs it)", type=int)
    flag("allow-cpu-metrics", defaults.allow_cpu_metrics,
         "Triton's CPU metrics (nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes)", type=_bool)
    flag("allow-gpu-metrics", defaults.allow_gpu_metrics, "Triton's GPU metrics, on hosts with a usable GPU", type=_bool)
    flag("metrics-interval-ms", defaults.metrics_interval_ms, "milliseconds between readings of the CPU metrics",
         type=float)
    metrics_env = os.environ.get(ENV_PREFIX + "METRICS_CONFIG")
    serve.add_argument(
        "--metrics-config", action="append", metavar="SETTING=VALUE",
        default=metrics_env.split(";") if metrics_env else None,
        help="Triton's metrics settings: counter_latencies=false, summary_latencies=true, "
        "summary_quantiles=<q>:<error>,..., summary_max_age=<secs>, histogram_latencies=true (repeat; "
        f"env {ENV_PREFIX}METRICS_CONFIG, ';'-separated)")
    flag("trace-otlp-endpoint", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
         "OTLP/HTTP traces URL (e.g. http://collector:4318/v1/traces): a span per inference request; "
         "empty: no OpenTelemetry export (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is honoured too)")
    _trace_flags(serve)
    flag("openai-token-ids", defaults.openai_token_ids,
         "how /v1/embeddings reads token-id input: 'tiktoken' (cl100k_base ids, as LangChain sends them) or "
         "'model' (the model tokenizer's own ids)", choices=TOKEN_ID_MODES)
    flag("cors-allowed-origins", "", "origins browsers may call the HTTP API from, ','-separated ('*': any); "
         "empty: no CORS headers, preflights refused (the default)")
    serve.add_argument("--server-name", *TRITON_ALIASES["--server-name"], default=_env("server-name", defaults.server_name),
                       help="name in ServerMetadata (Triton's --id: the server's identifier); use 'triton' for "
                       "clients that check it")
    flag("model-control-mode", defaults.model_control_mode,
         "'none': load every model at start, load/unload RPCs answer UNAVAILABLE; 'explicit': load the "
         "--load-model models at start, then load, reload and unload through the RPCs; 'poll': load every "
         "model, then follow the repository's changes every --repository-poll-secs", choices=CONTROL_MODES)
    load_env = os.environ.get(ENV_PREFIX + "LOAD_MODEL")
    serve.add_argument(
        "--load-model", action="append", metavar="NAME", default=load_env.split(",") if load_env else None,
        help="explicit mode: a model to load at start (repeat; '*' loads all) "
        f"(env {ENV_PREFIX}LOAD_MODEL, ','-separated)",
    )
    flag("repository-poll-secs", defaults.repository_poll_secs, "poll mode: seconds between repository scans", type=float)
    flag("model-load-thread-count", defaults.model_load_thread_count,
         "models loaded at once, at start and by the poll mode's scans (as Triton)", type=int)
    load = defaults.model_load
    flag("model-load-retry-count", load.retry_count,
         "times a model version that fails to load is tried again (as Triton)", type=int)
    flag("model-config-name", load.config_name or None,
         "a model's configuration is configs/<NAME>.pbtxt in its folder when that file exists, else config.pbtxt "
         "(Triton's custom configuration name)", type=_config_name)
    serve.add_argument("--disable-auto-complete-config", action="store_true",
                       default=_bool(str(_env("disable-auto-complete-config", not load.auto_complete))),
                       help="complete no model configuration from the model: config.pbtxt must exist and declare "
                       "every input and output (as Triton)")
    flag("strict-model-config", None, "DEPRECATED (Triton's): true is --disable-auto-complete-config", type=_bool)
    flag("exit-on-error", defaults.exit_on_error,
         "exit when initialization fails (a model repository that is missing or cannot be read: usage error; a "
         "model that fails to load at startup: exit code 1, as Triton does); false: stay up, a repository that "
         "cannot be read answering health (not live, not ready) and metadata, a model that failed not ready",
         type=_bool)
    flag("strict-readiness", defaults.strict_readiness,
         "ready only when every startup model is READY (false: ready once startup ends)", type=_bool)
    flag("rate-limit", defaults.rate_limit,
         "'off': an instance executes as soon as it is free, its instance group's rate_limiter ignored; "
         "'execution_count': also once the resources its rate_limiter lists are free, the least executed "
         "instance (times its priority) first (Triton's rate limiter)", type=str.lower, choices=RATE_LIMIT_MODES)
    resources_env = os.environ.get(ENV_PREFIX + "RATE_LIMIT_RESOURCE")
    serve.add_argument(
        "--rate-limit-resource", action="append", dest="rate_limit_resources", metavar="<name>:<count>[:<device>]",
        default=resources_env.split(",") if resources_env else None,
        help="copies of a rate limiter resource, on <device> or on each device (repeat); by default the most any "
        f"loaded instance needs (env {ENV_PREFIX}RATE_LIMIT_RESOURCE, ','-separated)",
    )
    cache_env = os.environ.get(ENV_PREFIX + "CACHE_CONFIG")
    serve.add_argument(
        "--cache-config", action="append", metavar="<cache>,<setting>=<value>",
        default=cache_env.split(";") if cache_env else None,
        help="the response cache, for models whose config has response_cache { enable: true }: 'local,size=<bytes>' "
        "(Triton's local cache) or 'redis,host=<host>' with 'redis,port=<port>' (Triton's redis cache, shared by "
        f"replicas and servers); repeat for more settings; env {ENV_PREFIX}CACHE_CONFIG, ';'-separated")
    backend_env = os.environ.get(ENV_PREFIX + "BACKEND_CONFIG")
    serve.add_argument(
        "--backend-config", action="append", metavar="<backend>,<setting>=<value>",
        default=backend_env.split(";") if backend_env else None,
        help="a backend's setting (repeat): the python backend's shm-default-byte-size, shm-growth-byte-size, "
        "shm-region-prefix-name and stub-timeout-seconds, for models run in stub processes (Triton's python backend "
        "settings), and execution-mode ('in_process' or 'process': where python models without an EXECUTION_MODE "
        "parameter run); the onnxruntime backend's enable-global-threadpool, intra_op_thread_count and "
        "inter_op_thread_count; default-max-batch-size=<n> (any backend, or one backend's) for auto-completed "
        f"batching; env {ENV_PREFIX}BACKEND_CONFIG, ';'-separated")
    flag("cache-directory", defaults.cache_directory, "where Triton looks for cache libraries (the 'local' and "
         "'redis' caches are built in; another cache name fails, naming this folder)")
    flag("response-cache-byte-size", None, "DEPRECATED: --cache-config local,size=<bytes>", type=int)
    flag("workers", str(defaults.workers),
         "replica processes serving the same ports, each a whole server with its own models ('auto': the CPUs "
         "this process may use, cgroup-aware); model control, settings and statistics act as one server",
         type=_workers)
    flag("exit-timeout-secs", defaults.exit_timeout_secs,
         "on SIGTERM/SIGINT, seconds in-flight requests get to finish before exit", type=int)
    flag("event-loop", defaults.event_loop, "event loop for gRPC and HTTP: 'uvloop' (faster) or 'asyncio'",
         choices=EVENT_LOOPS)
    flag("log-verbose", defaults.log_verbose, "verbose logging level (0 = info; Triton's true/false: 1/0)",
         type=_verbose)
    flag("log-format", defaults.log_format, "log line format: 'text', 'json' (one object a line), or Triton's "
         "'default' (LMMDD hh:mm:ss.ssssss) and 'ISO8601' (YYYY-MM-DDThh:mm:ssZ L)", choices=LOG_FORMATS)
    flag("log-file", defaults.log_file, "append the log to this file (empty: stderr)")
    for level in ("info", "warning", "error"):
        flag(f"log-{level}", getattr(defaults, f"log_{level}"), f"enable/disable {level}-level logging", type=_bool)
    flag("grpc-keepalive-time", defaults.grpc.keepalive_time, "ms between server keepalive pings", type=int)
    flag("grpc-keepalive-timeout", defaults.grpc.keepalive_timeout, "ms to wait for a keepalive ping ack", type=int)
    flag("grpc-keepalive-permit-without-calls", defaults.grpc.keepalive_permit_without_calls,
         "allow keepalive pings on connections with no call in flight", type=_bool)
    flag("grpc-http2-max-pings-without-data", defaults.grpc.http2_max_pings_without_data,
         "pings the server sends without data before it must wait for data", type=int)
    flag("grpc-http2-min-recv-ping-interval-without-data", defaults.grpc.http2_min_recv_ping_interval_without_data,
         "minimum ms between client pings without data before they count as strikes", type=int)
    flag("grpc-http2-max-ping-strikes", defaults.grpc.http2_max_ping_strikes,
         "bad pings tolerated before the connection is closed (0 = unlimited)", type=int)
    grpc = defaults.grpc
    flag("grpc-max-connection-age", grpc.max_connection_age, "ms a gRPC connection may live (default: no limit)",
         type=int)
    flag("grpc-max-connection-age-grace", grpc.max_connection_age_grace,
         "ms the calls of a connection past its age get to end (default: no limit)", type=int)
    flag("grpc-infer-response-compression-level", grpc.compression_level,
         "compression of gRPC responses: none, low, medium or high (gRPC's levels; all responses here, inference "
         "responses in Triton)", type=str.lower, choices=COMPRESSION_LEVELS)
    for proto, pattern in (("http", defaults.http.header_forward_pattern), ("grpc", grpc.header_forward_pattern)):
        flag(f"{proto}-header-forward-pattern", pattern, f"{proto} request headers whose name this regular expression "
             "finds are forwarded as string parameters of inference requests (Triton's flag)")
    for proto, reuse in (("http", defaults.reuse_http_port), ("grpc", grpc.reuse_port)):
        flag(f"reuse-{proto}-port", reuse, f"bind the {proto} port with SO_REUSEPORT, so that other servers may "
             "listen on it too", type=_bool)
    for name, (value, why) in TRITON_FIXED.items():
        flag(name, value, f"Triton's flag; only {str(value).lower()} is accepted: {why}", type=_bool)
    for name, (kind, repeat, why) in TRITON_WARNED.items():
        env = _env(name, None)
        serve.add_argument(f"--{name}", type=kind, action="append" if repeat else "store",
                           default=str(env).split(";") if repeat and env is not None else env,
                           help=f"Triton's flag, accepted with a warning: {why}" + ("" if not repeat else
                           f" (repeat; env {ENV_PREFIX}{name.upper().replace('-', '_')}, ';'-separated)"))
    _network_flags(serve, flag, defaults)
    return parser


def _trace_flags(serve: argparse.ArgumentParser) -> None:
    """Triton's --trace-config, and its deprecated single-setting flags, which add to it."""
    env = os.environ.get(ENV_PREFIX + "TRACE_CONFIG")
    serve.add_argument(
        "--trace-config", action="append", metavar="[MODE,]SETTING=VALUE", default=env.split(";") if env else None,
        help="Triton's trace settings: level=OFF|TIMESTAMPS|TENSORS, rate=N, count=N, mode=triton|opentelemetry, "
        "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=URL, opentelemetry,resource=K=V, "
        f"opentelemetry,bsp_*=N (repeat; env {ENV_PREFIX}TRACE_CONFIG, ';'-separated)")
    for name, setting in (("trace-file", "triton,file"), ("trace-level", "level"), ("trace-rate", "rate"),
                          ("trace-count", "count"), ("trace-log-frequency", "triton,log-frequency")):
        serve.add_argument(f"--{name}", dest="trace_config", action="append", metavar="VALUE",
                           type=_prefixed(setting),
                           help=f"Triton's deprecated spelling of --trace-config {setting}=VALUE")


def _prefixed(setting: str) -> Callable[[str], str]:
    return lambda value: f"{setting}={value}"


# ---- connection hygiene, TLS and access control ----

def _network_flags(serve: argparse.ArgumentParser, flag: Callable[..., None], defaults: Settings) -> None:
    flag("http-header-timeout-secs", defaults.http.header_timeout_secs,
         "seconds a request's line and headers may take to arrive (else 408 and close)", type=float)
    flag("http-body-timeout-secs", defaults.http.body_timeout_secs,
         "seconds a request body may stall between reads (else 408 and close)", type=float)
    flag("http-keepalive-timeout-secs", defaults.http.keepalive_timeout_secs,
         "seconds an idle keep-alive connection stays open", type=float)
    flag("http-max-connections", defaults.http.max_connections,
         "open HTTP connections (and requests in progress) beyond which requests get 503", type=int)
    flag("http-max-header-size", defaults.http.max_header_size,
         "bytes of request line and headers beyond which a request gets 431 and the connection closes", type=int)
    flag("http-max-chunks", defaults.http.max_chunks,
         "chunks one chunked request body may have (Triton's cap; more gets 400 and close)", type=int)
    for proto in ("grpc", "http"):
        tls: TlsSettings = getattr(defaults, proto).tls
        flag(f"{proto}-use-ssl", tls.use_ssl, f"serve {proto} over TLS", type=_bool)
        flag(f"{proto}-use-ssl-mutual", tls.mutual,
             f"serve {proto} over mutual TLS: clients need a certificate signed by --{proto}-root-cert", type=_bool)
        flag(f"{proto}-server-cert", "", f"PEM certificate (chain) of the {proto} server")
        flag(f"{proto}-server-key", "", f"PEM private key of the {proto} server")
        flag(f"{proto}-root-cert", "", f"PEM CA certificate(s) that client certificates must chain to ({proto} mTLS)")
    for name, header in (("grpc-restricted-protocol", "metadata triton-grpc-protocol-<key>"),
                         ("http-restricted-api", "header <key>")):
        env = os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"))
        serve.add_argument(
            f"--{name}", action="append", metavar="GROUPS:KEY=VALUE", default=env.split(";") if env else None,
            help=f"calls to these API groups ({', '.join(GROUPS)}) need the {header} with this value "
            f"(repeat for other groups; env {ENV_PREFIX}{name.upper().replace('-', '_')}, ';'-separated)")
    flag("api-key", defaults.api_key,
         "bearer token the semantic and OpenAI routes (/v1/...) require in 'Authorization: Bearer <key>' "
         "(empty: no token); prefer the environment variable")


def parse_settings(argv: Sequence[str]) -> Settings:
    """Turn ``serve`` arguments (and environment variables) into Settings; exits with usage on error
    (Settings' own checks included: ``kserve_v2.settings.server``)."""
    parser = _parser()
    args = parser.parse_args(argv)
    repositories = args.model_repository
    if repositories is None and os.environ.get(ENV_PREFIX + "MODEL_REPOSITORY"):
        try:
            repositories = [repository_argument(text)
                            for text in split_repositories(os.environ[ENV_PREFIX + "MODEL_REPOSITORY"])]
        except argparse.ArgumentTypeError as err:
            parser.error(f"{ENV_PREFIX}MODEL_REPOSITORY: {err}")
    if not repositories:
        parser.error("--model-repository is required")
    for name, (value, why) in TRITON_FIXED.items():
        if getattr(args, name.replace("-", "_")) != value:
            parser.error(f"--{name}={str(not value).lower()} is not supported: {why}")
    try:
        metrics_config = parse_metrics_config(args.metrics_config or ())
        trace_config = parse_trace_config(args.trace_config or (), args.trace_otlp_endpoint)
        return _settings(args, tuple(repositories), metrics_config, trace_config, _warnings(args))
    except ValueError as err:
        parser.error(str(err))  # Triton's texts where Triton has them, naming the flag


def _warnings(args: argparse.Namespace) -> tuple[str, ...]:
    """The start-up warnings of the Triton flags given: one for each flag of ``TRITON_WARNED``, and
    Triton's for ``--strict-model-config``."""
    found = [f"--{name} has no effect here: {why}" for name, (_, _, why) in TRITON_WARNED.items()
             if getattr(args, name.replace("-", "_")) is not None]
    if args.strict_model_config is not None:
        found.append(STRICT_DEPRECATED)
        if args.disable_auto_complete_config and not args.strict_model_config:
            found.append(STRICT_OVERRIDDEN)
    return tuple(found)


def _settings(args: argparse.Namespace, repositories: tuple[Path, ...], metrics_config: MetricsConfig,
              trace_config: TraceConfig, warnings: tuple[str, ...]) -> Settings:
    """The Settings of parsed arguments (argparse converts environment defaults with ``type`` but
    checks no ``choices`` on them: Settings check every value).

    Raises:
        ValueError: what Settings refuse.
    """
    grpc = GrpcSettings(args.grpc_keepalive_time, args.grpc_keepalive_timeout, args.grpc_keepalive_permit_without_calls,
                        args.grpc_http2_max_pings_without_data, args.grpc_http2_min_recv_ping_interval_without_data,
                        args.grpc_http2_max_ping_strikes, tuple(args.grpc_restricted_protocol or ()), _tls(args, "grpc"),
                        args.reuse_grpc_port, args.grpc_infer_response_compression_level, args.grpc_max_connection_age,
                        args.grpc_max_connection_age_grace, args.grpc_header_forward_pattern)
    model_load = ModelLoadSettings(args.model_config_name or "",
                                   not (args.disable_auto_complete_config or args.strict_model_config),
                                   args.model_load_retry_count)
    origins = tuple(o.strip() for o in args.cors_allowed_origins.split(",") if o.strip())
    http = HttpSettings(args.http_max_input_size, args.http_header_timeout_secs, args.http_body_timeout_secs,
                        args.http_keepalive_timeout_secs, args.http_max_connections, args.http_max_header_size,
                        args.http_max_chunks, tuple(args.http_restricted_api or ()), origins, _tls(args, "http"),
                        args.http_header_forward_pattern)
    flat = {f.name: getattr(args, f.name) for f in fields(Settings) if f.name not in _GROUPED}
    resources = tuple(parse_rate_limit_resource(r) for r in args.rate_limit_resources or ())
    cache = parse_cache_config(args.cache_config or (), args.cache_directory, args.response_cache_byte_size)
    return Settings(model_repositories=repositories, load_models=tuple(args.load_model or ()),
                    metrics_config=metrics_config, trace_config=trace_config, grpc=grpc, http=http,
                    rate_limit_resources=resources, cache_config=cache,
                    backend_config=parse_backend_config(args.backend_config or ()), model_load=model_load,
                    warnings=warnings, **flat)


def _tls(args: argparse.Namespace, proto: str) -> TlsSettings:
    """The TLS settings of ``proto`` (``grpc`` or ``http``) from its ``--<proto>-use-ssl*`` and certificate flags."""
    return TlsSettings(*(getattr(args, f"{proto}_{part}") for part in ("use_ssl", "use_ssl_mutual", "server_cert",
                                                                        "server_key", "root_cert")))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kserve-v2`` command; returns the exit code."""
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    if argv is None and sys.executable:
        _start_with_huge_pages()
    try:
        configure_logging(settings.log_format, settings.log_verbose, log_file=settings.log_file)
    except OSError as err:
        print(f"kserve-v2: cannot open --log-file: {err}", file=sys.stderr)
        return 1
    if settings.log_warning:  # once, before any replica starts; --log-warning=false silences them
        for warning in settings.warnings:
            logging.getLogger("kserve_v2").warning(warning)
    if settings.workers > 1:
        return _supervise(settings)
    with asyncio.Runner(loop_factory=_loop_factory(settings)) as runner:
        return runner.run(_serve(settings))


def _loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    # uvloop measured ~13% more gRPC infer/s than asyncio's loop on `simple` at concurrency 4
    return uvloop.new_event_loop if settings.event_loop == "uvloop" else None


def _supervise(settings: Settings) -> int:
    """``--workers N``: reserve the ports and run the supervisor of N replicas (``kserve_v2.workers.supervisor``)."""
    import kserve_v2.app  # noqa: F401 - before the fork: the replicas share its pages and need not import it

    try:
        settings, reserved = reserve_ports(settings)
    except OSError as err:
        logging.getLogger("kserve_v2").error("cannot start: a port cannot be bound: %s", err)
        return 1
    return Supervisor(settings.workers, partial(_replica, settings), reserved).run()


def _replica(settings: Settings, index: int, sock: socket.socket, restarted: bool) -> int:
    """One replica, in the child the supervisor forked: a whole server linked to the others."""
    configure_logging(settings.log_format, settings.log_verbose, index, settings.log_file)
    with asyncio.Runner(loop_factory=_loop_factory(settings)) as runner:
        return runner.run(_serve(settings, ReplicaGroup(index, sock, restarted)))


def _start_with_huge_pages() -> None:
    """Start this command once more with malloc's huge page tunable (``kserve_v2.host.allocator``); returns
    only when there is nothing to gain or the start fails."""
    environment = huge_page_environment(os.environ, *this_host())
    if environment is not None:
        try:
            os.execve(sys.executable, sys.orig_argv, environment)
        except OSError as err:
            print(f"kserve-v2: running without huge pages for tensors: {err}", file=sys.stderr)


async def _serve(settings: Settings, group: ReplicaGroup | None = None) -> int:
    from kserve_v2.app import App  # after logging is configured; grpc.aio needs the running loop

    try:
        app = App(settings, group)
    except RuntimeError as err:
        logging.getLogger("kserve_v2").error("cannot start: %s", err)
        return 1
    return await app.run()
