"""GRPCInferenceService servicer: pure delegation to ``InferenceService``.

Each RPC calls one service method; its errors are turned into a gRPC status where the handlers are
registered (``kserve_v2.grpc.registration``, with the one table of ``status``). ModelStreamInfer sends
each response of each request (``stream_replies``: one for most models, zero or many for a decoupled
one), echoing the request ``id``; a failed request is reported in ``error_message`` and the stream
stays open (Triton's ``grpc_service.proto``, ``ModelStreamInfer``).

ModelInfer and ModelStreamInfer (``RAW_METHODS``) are registered without a deserializer or a
serializer: they take the message's bytes as grpc.aio received them and answer bytes, through the
wire codec (``kserve_v2.codec``), so tensor data is read where it arrived and each output copied
once, into the response. Bytes that are not a valid message are INVALID_ARGUMENT with the text the
other RPCs give (``parsing.unparsable``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc
from kserve_v2.codec.messages import Buffer, InferParameter, InferRequest, InferResponse, parameter
from kserve_v2.codec.requests import decode_request
from kserve_v2.request.forwarded_headers import forwarded
from kserve_v2.codec.responses import encode_stream_error, response_parts, stream_parts
from kserve_v2.codec.wire import WireError
from kserve_v2.grpc.parsing import unparsable
from kserve_v2.grpc.status import describe
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.request.offload import Offload, is_heavy
from kserve_v2.service.inference_service import InferenceService

# Triton's stream parameters: the request asks for a response carrying only the final flag, and
# every response says whether it is its request's last (``stream_infer_handler.cc``)
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
GRPC_ERROR = "triton_grpc_error"  # the stream header: its first error ends it with a gRPC status

if TYPE_CHECKING:  # grpc's classes are generic in their stubs only
    Context = grpc.aio.ServicerContext[Any, Any]

# Requests of one stream executed at once; further requests wait to be read (backpressure).
STREAM_WINDOW = 64
SERVICE = "inference.GRPCInferenceService"
RAW_METHODS = frozenset({f"/{SERVICE}/ModelInfer", f"/{SERVICE}/ModelStreamInfer"})  # bytes in, bytes out
_DRAIN = "server draining"  # the cancel message that ends a stream's reading, not the stream


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """The 20 RPCs of Triton's GRPCInferenceService."""

    def __init__(self, service: InferenceService, header_forward: re.Pattern[str] | None = None) -> None:
        self._service = service
        self._header_forward = header_forward  # --grpc-header-forward-pattern (kserve_v2.request.forwarded_headers)
        self._readers: set[asyncio.Task[None]] = set()  # one per open ModelStreamInfer stream

    def drain(self) -> None:
        """Stop reading every open ModelStreamInfer stream: each ends (status OK) once the requests
        it has read are answered, so an idle stream does not hold the shutdown."""
        for reader in self._readers:
            reader.cancel(_DRAIN)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return self._service.server_live(request)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return self._service.server_ready(request)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        return self._service.model_ready(request)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return self._service.server_metadata(request)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        return self._service.model_metadata(request)

    async def ModelInfer(self, request: bytes, context: Context) -> bytes:
        """A serialized ModelInferRequest in, a serialized ModelInferResponse out (``RAW_METHODS``)."""
        offload = self._service.offload
        message = await _decoded(offload, request, "ModelInfer")
        if self._header_forward is not None:
            message = forwarded(message, context.invocation_metadata() or (), self._header_forward)
        carrier = _carrier(context) if self._service.traces else None  # the metadata is read only when we trace
        response, _ = await self._service.model_infer_reported(message, carrier, wire_bytes=len(request))
        return await _encoded(offload, *response_parts(response))

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        return self._service.model_config(request)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> pb.ModelStatisticsResponse:
        return await self._service.model_statistics(request)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> pb.RepositoryIndexResponse:
        return await self._service.extensions.repository_index(request)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Context) -> pb.RepositoryModelLoadResponse:
        return await self._service.extensions.repository_model_load(request)

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: Context) -> pb.RepositoryModelUnloadResponse:
        return await self._service.extensions.repository_model_unload(request)

    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest, context: Context) -> pb.SystemSharedMemoryStatusResponse:
        return self._service.extensions.system_shared_memory_status(request)

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest, context: Context) -> pb.SystemSharedMemoryRegisterResponse:
        return await self._service.extensions.system_shared_memory_register(request)

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context) -> pb.SystemSharedMemoryUnregisterResponse:
        return await self._service.extensions.system_shared_memory_unregister(request)

    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest, context: Context) -> pb.CudaSharedMemoryStatusResponse:
        return self._service.extensions.cuda_shared_memory_status(request)

    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest, context: Context) -> pb.CudaSharedMemoryRegisterResponse:
        return self._service.extensions.cuda_shared_memory_register(request)

    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest, context: Context) -> pb.CudaSharedMemoryUnregisterResponse:
        return self._service.extensions.cuda_shared_memory_unregister(request)

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Context) -> pb.TraceSettingResponse:
        return await self._service.extensions.trace_setting(request)

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Context) -> pb.LogSettingsResponse:
        return await self._service.extensions.log_settings(request)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        """Run a stream's requests concurrently (up to STREAM_WINDOW) and send each result as it completes;
        after ``drain`` read no more requests and end once those read are answered. Serialized
        ModelInferRequests in, serialized ModelStreamInferResponses out (``RAW_METHODS``); a message
        that does not parse ends the stream with INVALID_ARGUMENT (raised here, the status set where
        the handler is registered). A stream opened with the ``triton_grpc_error: true`` header ends
        at a request's first error with that error's status and message instead (Triton's "GRPC Status
        Codes" in its inference protocols guide)."""
        done: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()
        window = asyncio.Semaphore(STREAM_WINDOW)
        running: set[asyncio.Task[None]] = set()
        offload = self._service.offload
        grpc_error = (GRPC_ERROR, "true") in (context.invocation_metadata() or ())
        pattern, metadata = self._header_forward, context.invocation_metadata() or ()

        async def one(request: InferRequest, wire_bytes: int) -> None:
            if pattern is not None:  # the stream's metadata, on each of its requests (Triton's stream handler)
                request = forwarded(request, metadata, pattern)
            try:
                async for reply in stream_replies(self._service, request, wire_bytes, grpc_error):
                    done.put_nowait(reply)
            except Exception as err:  # noqa: BLE001 - only with grpc_error: it ends the stream
                done.put_nowait(err)
            finally:
                window.release()

        def start(request: InferRequest, wire_bytes: int) -> None:
            task = asyncio.create_task(one(request, wire_bytes))
            running.add(task)
            task.add_done_callback(running.discard)

        async def read() -> None:
            try:
                try:
                    while True:
                        await window.acquire()  # a drain may cancel here or below: no request is lost
                        try:
                            data = await anext(request_iterator)
                        except StopAsyncIteration:
                            break
                        if not is_heavy(len(data)):
                            start(_decoded_now(data, "ModelStreamInfer"), len(data))
                            continue
                        decoding = asyncio.ensure_future(_decoded(offload, data, "ModelStreamInfer"))
                        try:
                            request = await asyncio.shield(decoding)
                        except asyncio.CancelledError as err:
                            if err.args != (_DRAIN,):
                                decoding.cancel()
                                raise
                            start(await decoding, len(data))  # a message read before the drain is answered
                            raise
                        start(request, len(data))
                except asyncio.CancelledError as err:
                    if err.args != (_DRAIN,):
                        raise  # the client went away: the generator's finally cancels the running requests
                if running:
                    await asyncio.gather(*running)
            finally:
                done.put_nowait(None)

        reader = asyncio.create_task(read())
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        try:
            while (response := await done.get()) is not None:
                if isinstance(response, Exception):
                    raise response  # its status where the handler is registered
                yield response
            await reader
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()


async def stream_replies(service: InferenceService, request: InferRequest, wire_bytes: int | None = None,
                         grpc_error: bool = False) -> AsyncIterator[bytes]:
    """The serialized ModelStreamInferResponses of one request on a stream, as Triton's stream handler
    writes them: each response of the request (``InferenceService.model_stream``) with
    ``triton_final_response`` telling whether it is the last; a response's error in ``error_message``
    with the request's id, model and version; a final flag sent without a response only when the
    request sets ``triton_enable_empty_final_response``; a request that fails before any response as
    one error. ``wire_bytes``: the size of the message the request was decoded from. With
    ``grpc_error`` (the stream's ``triton_grpc_error`` header) an error is raised, not reported."""
    asked = request.parameters.get(EMPTY_FINAL)
    empty_final = asked is not None and asked.choice == "bool_param" and asked.value is True
    offload = service.offload
    try:
        async for item in service.model_stream(request, wire_bytes):
            final = parameter(item.final)
            if item.response is not None:
                item.response.parameters[FINAL] = final
                yield await _encoded(offload, *stream_parts(item.response))
            elif item.error is not None:
                if grpc_error:
                    raise item.error
                yield _failed(request, item.error, {FINAL: final})
            elif item.final and empty_final:
                answering = InferResponse(request.model_name, request.model_version, request.id, {FINAL: final})
                yield b"".join(stream_parts(answering)[0])
    except Exception as err:  # noqa: BLE001 - reported in-stream
        if grpc_error:
            raise
        yield _failed(request, err)


def _failed(request: InferRequest, err: Exception, parameters: dict[str, InferParameter] | None = None) -> bytes:
    """The serialized ModelStreamInferResponse of a failed request: the error's text, and a response
    without outputs naming the request it answers."""
    _, message = describe(err)
    return encode_stream_error(message, request.id, request.model_name, request.model_version, parameters)


def _carrier(context: Context) -> dict[str, str]:
    """The call's text metadata, for a W3C ``traceparent`` (binary ``-bin`` entries carry no trace context)."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


async def _decoded(offload: Offload, data: bytes, method: str) -> InferRequest:
    """The request in ``data``, decoded on the decode thread pool when it is large (typed contents
    decode element by element there, without holding up the event loop).

    Raises:
        InvalidInput: not a valid ModelInferRequest, with the text of the other RPCs -> INVALID_ARGUMENT.
    """
    if not is_heavy(len(data)):
        return _decoded_now(data, method)
    try:
        return await offload.in_thread(decode_request, data)
    except WireError:
        raise InvalidInput(unparsable(f"{SERVICE}.{method} request")) from None


def _decoded_now(data: bytes, method: str) -> InferRequest:
    """The request in ``data``, decoded here (``_decoded``'s errors)."""
    try:
        return decode_request(data)
    except WireError:
        raise InvalidInput(unparsable(f"{SERVICE}.{method} request")) from None


async def _encoded(offload: Offload, parts: list[Buffer], size: int) -> bytes:
    """The message whose parts are given, joined: on the decode thread pool when it is large (the one
    copy of each output into the message)."""
    return await offload.in_thread(b"".join, parts) if is_heavy(size) else b"".join(parts)
