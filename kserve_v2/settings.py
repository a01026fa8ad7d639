"""Server settings: pure, frozen data. Defaults and names follow Triton's command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kserve_v2.metrics_config import MetricsConfig
from kserve_v2.trace_config import TraceConfig

# how /v1/embeddings reads token-id input (transcoding.token_ids)
TOKEN_ID_MODES = ("tiktoken", "model")


@dataclass(frozen=True)
class Settings:
    """Everything the server needs to start.

    Times are in milliseconds unless the name says secs; ports are TCP ports (0 = any free one).
    """

    model_repositories: tuple[Path, ...]
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 2**20
    max_request_decoded_bytes: int = 3 * 2**30  # a gRPC tensor of ~350 MB (kserve_v2.budget counts its copies)
    request_memory_pool_bytes: int = 4 * 2**30
    allow_metrics: bool = True
    allow_client_shm: bool = False
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval_ms: float = 2000.0  # how often the CPU metrics are read (Triton's default)
    metrics_config: MetricsConfig = MetricsConfig()
    server_name: str = "kserve_v2"
    model_control_mode: str = "none"
    exit_on_error: bool = True  # false: a repository that cannot be read leaves the server up, not live
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    exit_timeout_secs: int = 30
    event_loop: str = "uvloop"
    log_verbose: int = 0
    log_format: str = "text"
    trace_config: TraceConfig = TraceConfig()  # Triton's --trace-config, with --trace-otlp-endpoint folded in
    openai_token_ids: str = "tiktoken"
    cors_allowed_origins: tuple[str, ...] = ()
    grpc_keepalive_time: int = 7_200_000
    grpc_keepalive_timeout: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    # ---- connection hygiene, TLS and access control ----
    http_header_timeout_secs: float = 10.0
    http_body_timeout_secs: float = 30.0
    http_keepalive_timeout_secs: float = 65.0
    http_max_connections: int = 1000
    http_max_header_size: int = 32 * 1024
    http_max_chunks: int = 65_536
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    http_use_ssl: bool = False
    http_use_ssl_mutual: bool = False
    http_server_cert: str = ""
    http_server_key: str = ""
    http_root_cert: str = ""
    grpc_restricted_protocol: tuple[str, ...] = ()
    http_restricted_api: tuple[str, ...] = ()
    api_key: str = ""
