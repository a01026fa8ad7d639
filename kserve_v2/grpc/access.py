"""``--grpc-restricted-protocol``: a server interceptor, installed only when a group is restricted.

Every RPC belongs to one of Triton's API groups (the table below follows Triton's grpc_server.cc).
A call to a restricted group without the metadata ``triton-grpc-protocol-<key>: <value>`` ends
with UNAVAILABLE "This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'",
Triton's code and text, before its request message is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from kserve_v2.settings.restrictions import Restriction

_SERVICE = "/inference.GRPCInferenceService/"
_HEALTH = "/grpc.health.v1.Health/"
_METHOD_GROUPS = {
    **{_SERVICE + m: "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{_HEALTH + m: "health" for m in ("Check", "Watch")},
    _SERVICE + "ServerMetadata": "metadata",
    _SERVICE + "ModelMetadata": "metadata",
    _SERVICE + "ModelInfer": "inference",
    _SERVICE + "ModelStreamInfer": "inference",
    **{_SERVICE + f"{kind}SharedMemory{op}": "shared-memory"
       for kind in ("System", "Cuda") for op in ("Status", "Register", "Unregister")},
    _SERVICE + "ModelConfig": "model-config",
    **{_SERVICE + m: "model-repository" for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")},
    _SERVICE + "ModelStatistics": "statistics",
    _SERVICE + "TraceSetting": "trace",
    _SERVICE + "LogSettings": "logging",
}
METADATA_PREFIX = "triton-grpc-protocol-"


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls to restricted groups that lack their metadata (see the module docstring)."""

    def __init__(self, restrictions: Mapping[str, Restriction]) -> None:
        self._rules = {method: (METADATA_PREFIX + rule.header, rule.value)
                       for method, group in _METHOD_GROUPS.items() if (rule := restrictions.get(group))}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        rule = self._rules.get(handler_call_details.method)
        if rule is None or rule in tuple(handler_call_details.invocation_metadata or ()):
            return await continuation(handler_call_details)
        return _denied(rule[0])


def _denied(header: str) -> grpc.RpcMethodHandler[Any, Any]:
    message = f"This protocol is restricted, expecting header '{header}'"

    async def deny(_requests: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    # A streaming-request handler never reads the request: the status goes out without waiting for
    # the upload. Unary and streaming calls look the same on the wire, so it serves every method.
    return grpc.stream_stream_rpc_method_handler(deny)
