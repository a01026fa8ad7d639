"""Build the grpc.aio server: options, servicers (inference + grpc.health.v1), port binding."""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc

from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc
from kserve_v2.grpc.access import RestrictedProtocolInterceptor
from kserve_v2.grpc.health import DrainingHealthServicer
from kserve_v2.grpc.registration import CheckedRegistration
from kserve_v2.grpc.servicer import RAW_METHODS, SERVICE, Servicer
from kserve_v2.service.inference_service import InferenceService
from kserve_v2.settings.restrictions import parse_restrictions
from kserve_v2.settings.server import Settings, TlsSettings, header_pattern

# Triton's limit both ways (INT32_MAX): tritonclient sends and accepts messages up to 2 GiB - 1.
MAX_MESSAGE_BYTES = 2**31 - 1
SERVICE_NAME = SERVICE
# Triton's --grpc-infer-response-compression-level: gRPC core's grpc_compression_level values
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


def build_server(service: InferenceService, settings: Settings, reuse_port: bool = False
                 ) -> tuple[grpc.aio.Server, DrainingHealthServicer, Servicer, int]:
    """Create the server and bind its port (not started): TLS or mTLS and restricted groups as set.
    ``reuse_port``: bind with ``SO_REUSEPORT``, sharing the port with the other replicas of
    ``--workers``; also with Triton's ``--reuse-grpc-port`` (off otherwise, so that no other server
    can share it unnoticed). ``--grpc-infer-response-compression-level`` is gRPC's default
    compression level of the server's responses (gRPC picks an algorithm the client accepts; Triton
    sets it on inference responses only), ``--grpc-max-connection-age[-grace]`` gRPC's channel
    arguments of those names.

    Returns:
        (server, health servicer, inference servicer, bound port) - the port differs from the
        setting when it is 0.

    Raises:
        RuntimeError: the address cannot be bound.
        OSError: a certificate or key file cannot be read.
    """
    grpc_settings = settings.grpc
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", grpc_settings.keepalive_time),
        ("grpc.keepalive_timeout_ms", grpc_settings.keepalive_timeout),
        ("grpc.keepalive_permit_without_calls", int(grpc_settings.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", grpc_settings.http2_max_pings_without_data),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", grpc_settings.http2_min_recv_ping_interval_without_data),
        ("grpc.http2.max_ping_strikes", grpc_settings.http2_max_ping_strikes),
        ("grpc.so_reuseport", int(reuse_port or grpc_settings.reuse_port)),
    ]
    if grpc_settings.compression_level != "none":
        options.append(("grpc.default_compression_level", COMPRESSION_LEVELS[grpc_settings.compression_level]))
    if grpc_settings.max_connection_age is not None:
        options.append(("grpc.max_connection_age_ms", grpc_settings.max_connection_age))
    if grpc_settings.max_connection_age_grace is not None:
        options.append(("grpc.max_connection_age_grace_ms", grpc_settings.max_connection_age_grace))
    restrictions = parse_restrictions(grpc_settings.restricted_protocol, "grpc-restricted-protocol")
    interceptors = [RestrictedProtocolInterceptor(restrictions)] if restrictions else []  # none: no per-call cost
    server = grpc.aio.server(options=options, interceptors=interceptors)
    servicer = Servicer(service, header_pattern(grpc_settings.header_forward_pattern, "grpc-header-forward-pattern"))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, CheckedRegistration(server, RAW_METHODS))
    health_servicer = DrainingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{settings.grpc_address}:{settings.grpc_port}"
    credentials = server_credentials(grpc_settings.tls)
    port = server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
    return server, health_servicer, servicer, port


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from Triton's flags (``--grpc-use-ssl``, ``--grpc-use-ssl-mutual``, which wins,
    ``--grpc-server-cert``, ``--grpc-server-key``, ``--grpc-root-cert``), or None for plaintext.

    With mutual TLS a client must present a certificate that chains to the root certificate;
    otherwise the handshake fails (the client sees UNAVAILABLE).
    """
    mutual = tls.mutual
    if not tls.enabled:
        return None
    pair = (Path(tls.server_key).read_bytes(), Path(tls.server_cert).read_bytes())
    root = Path(tls.root_cert).read_bytes() if tls.root_cert else None
    return grpc.ssl_server_credentials([pair], root_certificates=root if mutual else None, require_client_auth=mutual)
