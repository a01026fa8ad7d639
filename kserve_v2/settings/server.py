"""Server settings: frozen data that checks itself. Defaults and names follow Triton's command line.

A ``Settings`` that exists is one the server can start with, wherever it was built (the command
line builds it in ``kserve_v2.cli``): each group checks its values when it is made and raises
``ValueError`` naming the flag, with Triton's texts where Triton has them. The gRPC and HTTP front
ends' own settings are grouped (``GrpcSettings``, ``HttpSettings``, each with its ``TlsSettings``);
mode strings are ``Literal`` types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from kserve_v2.settings.backend_config import BackendConfig
from kserve_v2.settings.cache_config import DEFAULT_DIRECTORY, CacheConfig
from kserve_v2.settings.metrics_config import MetricsConfig
from kserve_v2.settings.rate_limit import RATE_LIMIT_MODES, RateLimitMode, RateLimitResource
from kserve_v2.settings.restrictions import parse_restrictions
from kserve_v2.settings.trace_config import TraceConfig

ControlMode = Literal["none", "explicit", "poll"]
EventLoop = Literal["uvloop", "asyncio"]
LogFormat = Literal["text", "json", "default", "ISO8601"]  # ours, then Triton's line layouts
CompressionLevel = Literal["none", "low", "medium", "high"]  # Triton's --grpc-infer-response-compression-level
TokenIds = Literal["tiktoken", "model"]  # how /v1/embeddings reads token-id input (transcoding.semantic.token_ids)
CONTROL_MODES: tuple[str, ...] = get_args(ControlMode)
EVENT_LOOPS: tuple[str, ...] = get_args(EventLoop)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
TOKEN_ID_MODES: tuple[str, ...] = get_args(TokenIds)
COMPRESSION_LEVELS: tuple[str, ...] = get_args(CompressionLevel)


@dataclass(frozen=True)
class TlsSettings:
    """TLS of one front end (Triton's ``--<grpc|http>-use-ssl`` flags); ``mutual`` wins over ``use_ssl``
    and needs ``root_cert``, which client certificates must chain to. Paths name PEM files; the
    front end's settings check them (``check``)."""

    use_ssl: bool = False
    mutual: bool = False
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""

    @property
    def enabled(self) -> bool:
        """Whether the front end serves TLS."""
        return self.use_ssl or self.mutual

    def check(self, front_end: str) -> None:
        """Check the files TLS needs (``front_end``: ``grpc`` or ``http``, for the flags' names).

        Raises:
            ValueError: TLS on without a certificate, key or (mutual) root certificate file.
        """
        if self.enabled:
            for part in ["server_cert", "server_key"] + (["root_cert"] if self.mutual else []):
                path = getattr(self, part)
                if not path or not Path(path).is_file():
                    raise ValueError(f"--{front_end}-{part.replace('_', '-')} must name a PEM file for TLS, got '{path}'")


def header_pattern(pattern: str, flag: str) -> re.Pattern[str] | None:
    """Triton's ``--<front end>-header-forward-pattern`` compiled (None when empty: nothing is forwarded;
    ``kserve_v2.request.forwarded_headers``).

    Raises:
        ValueError: not a regular expression, naming ``flag`` (a usage error at start).
    """
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ValueError(f"--{flag} is not a regular expression: {err}") from None


@dataclass(frozen=True)
class GrpcSettings:
    """The gRPC front end's keepalive and HTTP/2 ping policy and connection age (ms; Triton's ``--grpc-*``
    flags, gRPC's channel arguments), restricted protocol groups, TLS, ``SO_REUSEPORT``, the
    compression level of responses and the metadata forwarded as request parameters.

    Raises:
        ValueError: TLS without its files, a ``restricted_protocol`` value Triton would refuse
            (``kserve_v2.settings.restrictions``), a compression level other than
            ``COMPRESSION_LEVELS`` (Triton's text), a negative connection age or a header forward
            pattern that is not a regular expression.
    """

    keepalive_time: int = 7_200_000
    keepalive_timeout: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data: int = 300_000
    http2_max_ping_strikes: int = 2
    restricted_protocol: tuple[str, ...] = ()
    tls: TlsSettings = TlsSettings()
    reuse_port: bool = False  # Triton's --reuse-grpc-port: bind with SO_REUSEPORT
    compression_level: CompressionLevel = "none"  # Triton's --grpc-infer-response-compression-level
    max_connection_age: int | None = None  # ms a connection may live (--grpc-max-connection-age); None: no limit
    max_connection_age_grace: int | None = None  # ms calls get to end after that (--grpc-max-connection-age-grace)
    header_forward_pattern: str = ""  # Triton's --grpc-header-forward-pattern: metadata forwarded as parameters

    def __post_init__(self) -> None:
        header_pattern(self.header_forward_pattern, "grpc-header-forward-pattern")
        self.tls.check("grpc")
        parse_restrictions(self.restricted_protocol, "grpc-restricted-protocol")
        if self.compression_level not in COMPRESSION_LEVELS:  # Triton's text, sic
            raise ValueError("invalid argument for --grpc_infer_response_compression_level")
        for name in ("max_connection_age", "max_connection_age_grace"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"--grpc-{name.replace('_', '-')} must be >= 0")


@dataclass(frozen=True)
class HttpSettings:
    """The HTTP front end's limits (bytes, seconds, counts), restricted API groups, CORS origins, TLS
    and the headers forwarded as request parameters.

    Raises:
        ValueError: a limit that is not > 0, TLS without its files, a ``restricted_api`` value
            Triton would refuse, or a header forward pattern that is not a regular expression.
    """

    max_input_size: int = 64 * 2**20
    header_timeout_secs: float = 10.0
    body_timeout_secs: float = 30.0
    keepalive_timeout_secs: float = 65.0
    max_connections: int = 1000
    max_header_size: int = 32 * 1024
    max_chunks: int = 65_536
    restricted_api: tuple[str, ...] = ()
    cors_allowed_origins: tuple[str, ...] = ()
    tls: TlsSettings = TlsSettings()
    header_forward_pattern: str = ""  # Triton's --http-header-forward-pattern: headers forwarded as parameters

    def __post_init__(self) -> None:
        header_pattern(self.header_forward_pattern, "http-header-forward-pattern")
        for name in ("max_input_size", "header_timeout_secs", "body_timeout_secs", "keepalive_timeout_secs",
                     "max_connections", "max_header_size", "max_chunks"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--http-{name.replace('_', '-')} must be > 0")
        self.tls.check("http")
        parse_restrictions(self.restricted_api, "http-restricted-api")


@dataclass(frozen=True)
class ModelLoadSettings:
    """How the models of the repositories are read and loaded (Triton's flags).

    Attributes:
        config_name: ``--model-config-name``: a model folder's ``configs/<name>.pbtxt`` is its
            configuration when that file exists, else ``config.pbtxt`` ("": always ``config.pbtxt``).
        auto_complete: false with ``--disable-auto-complete-config`` or ``--strict-model-config=true``:
            a configuration file must exist and declare every input and output; nothing is filled in
            from the model (Triton's ``ValidateModelIOConfig``).
        retry_count: ``--model-load-retry-count``: times a version that fails to load is tried again.

    Raises:
        ValueError: a config name that is empty when given or holds a space or a path separator,
            or a negative retry count.
    """

    config_name: str = ""
    auto_complete: bool = True
    retry_count: int = 0

    def __post_init__(self) -> None:
        if any(c.isspace() or c in "/\\\0" for c in self.config_name) or self.config_name in (".", ".."):
            raise ValueError(f"--model-config-name must be a file name without spaces, got '{self.config_name}'")
        if self.retry_count < 0:
            raise ValueError("--model-load-retry-count must be >= 0")


@dataclass(frozen=True)
class Settings:
    """Everything the server needs to start.

    Times are in milliseconds unless the name says secs; ports are TCP ports (0 = any free one).

    Raises:
        ValueError: a value the server cannot start with, naming its flag: a model repository that
            is not a folder (unless ``exit_on_error`` is false), a mode outside its ``Literal``,
            ``load_models`` outside explicit mode, a poll interval, memory limit or metrics interval
            that is not > 0, a per-request memory limit above the pool, or fewer than 1 worker.
    """

    model_repositories: tuple[Path, ...]
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    max_request_decoded_bytes: int = 3 * 2**30  # a gRPC tensor of ~640 MB (kserve_v2.request.budget counts its copies)
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
    model_control_mode: ControlMode = "none"
    exit_on_error: bool = True  # false: a repository that cannot be read leaves the server up, not live
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    model_load_thread_count: int = 4  # models loaded at once, at start and by the poller (Triton's default)
    strict_readiness: bool = True
    rate_limit: RateLimitMode = "off"  # Triton's --rate-limit (kserve_v2.scheduling.rate_limiter)
    rate_limit_resources: tuple[RateLimitResource, ...] = ()  # Triton's --rate-limit-resource, repeated
    cache_config: CacheConfig | None = None  # Triton's --cache-config (kserve_v2.service.response_cache); None: off
    cache_directory: str = DEFAULT_DIRECTORY  # Triton's --cache-directory (only named in errors: 'local' is built in)
    backend_config: BackendConfig = BackendConfig()  # Triton's --backend-config=[<backend>,]<setting>=<value>
    exit_timeout_secs: int = 30
    event_loop: EventLoop = "uvloop"
    log_verbose: int = 0
    log_format: LogFormat = "text"
    log_info: bool = True  # Triton's --log-info, --log-warning, --log-error: each level on or off
    log_warning: bool = True
    log_error: bool = True
    log_file: str = ""  # Triton's --log-file: the log goes (appended) to this file; "": stderr
    reuse_http_port: bool = False  # Triton's --reuse-http-port: bind the HTTP port with SO_REUSEPORT
    model_load: ModelLoadSettings = ModelLoadSettings()
    warnings: tuple[str, ...] = ()  # start-up warnings: Triton flags given that have no effect here (kserve_v2.cli)
    trace_config: TraceConfig = TraceConfig()  # Triton's --trace-config, with --trace-otlp-endpoint folded in
    openai_token_ids: TokenIds = "tiktoken"
    api_key: str = ""  # the bearer token the semantic and OpenAI routes require ("" : none)
    workers: int = 1  # replica processes behind the same ports (kserve_v2.workers.supervisor); 1: this process serves
    grpc: GrpcSettings = GrpcSettings()
    http: HttpSettings = HttpSettings()

    def __post_init__(self) -> None:
        if self.exit_on_error:  # else the server starts, not live (kserve_v2.app)
            for repository in self.model_repositories:
                if not repository.is_dir():
                    raise ValueError(f"model repository '{repository}' is not a directory")
        for flag, value, allowed in (("event-loop", self.event_loop, EVENT_LOOPS),
                                     ("log-format", self.log_format, LOG_FORMATS),
                                     ("model-control-mode", self.model_control_mode, CONTROL_MODES),
                                     ("openai-token-ids", self.openai_token_ids, TOKEN_ID_MODES),
                                     ("rate-limit", self.rate_limit, RATE_LIMIT_MODES)):
            if value not in allowed:
                raise ValueError(f"--{flag} must be one of {allowed}, got '{value}'")
        if self.load_models and self.model_control_mode != "explicit":
            raise ValueError("--load-model needs --model-control-mode explicit")
        if self.repository_poll_secs <= 0:
            raise ValueError("--repository-poll-secs must be > 0")
        if self.model_load_thread_count < 1:
            raise ValueError("--model-load-thread-count must be >= 1")
        if self.max_request_decoded_bytes <= 0 or self.request_memory_pool_bytes < self.max_request_decoded_bytes:
            raise ValueError("--max-request-decoded-bytes must be > 0 and at most --request-memory-pool-bytes")
        if self.metrics_interval_ms <= 0:
            raise ValueError("--metrics-interval-ms must be > 0")
        if self.workers < 1:
            raise ValueError("--workers must be a number >= 1, or 'auto'")
