"""grpc.health.v1 with a drain that ends Watch streams (the reference servicer keeps them open).

grpcio-health-checking's asyncio servicer sends NOT_SERVING to watchers on
``enter_graceful_shutdown`` but keeps every Watch stream open, so ``server.stop(grace)`` waits the
whole grace period for them. Here a Watch returns (status OK) once it has sent NOT_SERVING (or
SERVICE_UNKNOWN for a name never set) during shutdown, and ``shut_down`` wakes every watcher,
including those of unknown services. The status sent during shutdown does not wait for the base
class to store NOT_SERVING: a Watch still writing when shutdown begins holds its condition, and
would otherwise end after the old status, so it looks again after every write.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2


class DrainingHealthServicer(health.aio.HealthServicer):
    """``grpc.health.v1.Health`` (Check and Watch) whose Watch streams end when the server drains."""

    # the base class's state, read here (its stubs do not declare it)
    _server_status: dict[str, int]  # service -> HealthCheckResponse.ServingStatus
    _server_watchers: dict[str, asyncio.Condition]
    _gracefully_shutting_down: bool

    def __init__(self) -> None:
        super().__init__()
        self._watching: Counter[str] = Counter()  # open Watch streams per service name

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Send the service's status now and on every change; end after the status sent while shutting down."""
        condition = self._server_watchers[request.service]
        self._watching[request.service] += 1
        last_status = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
                    if self._gracefully_shutting_down and status != health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
                        status = health_pb2.HealthCheckResponse.NOT_SERVING  # what enter_graceful_shutdown is storing
                    if status != last_status:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                        last_status = status
                        continue  # shutdown may have begun during the write: look again
                    if self._gracefully_shutting_down:
                        return
                    await condition.wait()
        finally:  # no state stays behind for a name nobody watches any more
            self._watching[request.service] -= 1
            if not self._watching[request.service]:
                del self._watching[request.service]
                self._server_watchers.pop(request.service, None)

    async def shut_down(self) -> None:
        """Every service NOT_SERVING from now on; every Watch stream gets it and ends."""
        await self.enter_graceful_shutdown()
        for condition in list(self._server_watchers.values()):
            async with condition:
                condition.notify_all()
