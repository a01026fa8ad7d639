"""Build the grpc.aio server: options, servicers (inference + grpc.health.v1), port binding."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc
from kserve_v2.grpc.servicer import Servicer
from kserve_v2.service import InferenceService
from kserve_v2.settings import Settings

# Triton's limit both ways (INT32_MAX): tritonclient sends and accepts messages up to 2 GiB - 1.
MAX_MESSAGE_BYTES = 2**31 - 1
SERVICE_NAME = "inference.GRPCInferenceService"


def build_server(service: InferenceService, settings: Settings) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """Create the server and bind its port (not started).

    Returns:
        (server, health servicer, bound port) - the port differs from the setting when it is 0.

    Raises:
        RuntimeError: the address cannot be bound.
    """
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", settings.grpc_http2_min_recv_ping_interval_without_data),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(service), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{settings.grpc_address}:{settings.grpc_port}")
    return server, health_servicer, port
