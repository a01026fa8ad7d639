"""kserve_v2.grpc.health's drain, in-process: every Watch stream gets NOT_SERVING and ends, even one
still writing its previous status when shutdown begins (the grpc.health.v1 protocol and
grpcio-health-checking's ``enter_graceful_shutdown``)."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from kserve_v2.grpc.health import DrainingHealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class SlowWriteContext:
    """The ``write`` of a Watch's servicer context; the first write waits for ``release``."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.writing = asyncio.Event()
        self.release = asyncio.Event()

    async def write(self, response: health_pb2.HealthCheckResponse) -> None:
        self.writing.set()
        if not self.sent:
            await self.release.wait()
        self.sent.append(response.status)


def test_a_watch_mid_write_at_shutdown_still_gets_not_serving() -> None:
    async def run() -> list[int]:
        servicer = DrainingHealthServicer()
        context = SlowWriteContext()
        watch = asyncio.create_task(servicer.Watch(health_pb2.HealthCheckRequest(service=""), context))  # type: ignore[arg-type]
        await context.writing.wait()  # the Watch holds its condition while it writes SERVING
        shutdown = asyncio.create_task(servicer.shut_down())
        await asyncio.sleep(0)  # the shutdown flag is set; storing NOT_SERVING waits for the condition
        context.release.set()
        await asyncio.wait_for(asyncio.gather(watch, shutdown), 5)
        return context.sent

    assert asyncio.run(run()) == [SERVING, NOT_SERVING]


def test_a_watch_of_an_unknown_service_ends_at_shutdown_as_unknown() -> None:
    async def run() -> list[int]:
        servicer = DrainingHealthServicer()
        context = SlowWriteContext()
        context.release.set()
        watch = asyncio.create_task(servicer.Watch(health_pb2.HealthCheckRequest(service="no.such"), context))  # type: ignore[arg-type]
        await context.writing.wait()
        await servicer.shut_down()
        await asyncio.wait_for(watch, 5)
        return context.sent

    assert asyncio.run(run()) == [UNKNOWN]
