"""kserve_v2.grpc.servicer's streams in-process: ModelStreamInfer and ``stream_replies`` against a fake
service whose ``model_stream`` answers from a script, read as the serialized
ModelStreamInferResponses a client receives (Triton's ``grpc_service.proto`` and the stream parameters
of its ``stream_infer_handler.cc``), with no server process and no gRPC channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.backend.decoupled import Streamed
from kserve_v2.codec.messages import InferRequest, InferResponse, OutputTensor, RequestHeader, parameter
from kserve_v2.grpc.servicer import EMPTY_FINAL, FINAL, GRPC_ERROR, Servicer, stream_replies
from kserve_v2.protocol.errors import InternalError, InvalidInput, NotFound
from kserve_v2.request.offload import Offload


def _response(request: InferRequest, value: int) -> InferResponse:
    return InferResponse(request.model_name, "1", request.id, outputs=[OutputTensor("OUT", "INT32", [1])],
                         raw_output_contents=[np.array([value], "<i4").tobytes()])


class Service:
    """The part of ``InferenceService`` the servicer's streams use: ``model_stream`` answers each model
    name from a script, and the offload pool. ``slow`` waits for ``release`` before it answers."""

    def __init__(self) -> None:
        self.offload = Offload(threads=1)
        self.release = asyncio.Event()

    async def model_stream(self, request: InferRequest, wire_bytes: int | None = None) -> AsyncIterator[Streamed]:
        name = request.model_name
        if name == "missing":
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if name == "slow":
            await self.release.wait()
        if name == "twice":  # a decoupled model: two responses, then the final flag alone
            yield Streamed(_response(request, 1), None, False)
            yield Streamed(_response(request, 2), None, False)
            yield Streamed(None, None, True)
        elif name == "midway":
            yield Streamed(_response(request, 1), None, False)
            yield Streamed(None, InternalError("broke midway"), True)
        else:
            yield Streamed(_response(request, wire_bytes or 0), None, True)


class Context:
    """The ServicerContext's one method the streams read: the call's metadata."""

    def __init__(self, *metadata: tuple[str, str]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


def _request(model: str, id: str = "", empty_final: bool = False) -> InferRequest:
    parameters = {EMPTY_FINAL: parameter(True)} if empty_final else {}
    return InferRequest(RequestHeader(model, "", parameters), id)


def _replies(request: InferRequest, grpc_error: bool = False) -> list[pb.ModelStreamInferResponse]:
    async def read() -> list[bytes]:
        return [reply async for reply in stream_replies(Service(), request, 12, grpc_error)]  # type: ignore[arg-type]

    return [pb.ModelStreamInferResponse.FromString(reply) for reply in asyncio.run(read())]


def _summary(reply: pb.ModelStreamInferResponse) -> tuple[str, str, list[int], bool | None]:
    """(error message, request id, OUT's values, triton_final_response) of one reply."""
    response = reply.infer_response
    values = [v for raw in response.raw_output_contents for v in np.frombuffer(raw, "<i4").tolist()]
    final = response.parameters[FINAL].bool_param if FINAL in response.parameters else None
    return reply.error_message, response.id, values, final


def test_each_response_says_whether_it_is_the_last_and_a_bare_final_flag_is_sent_only_when_asked() -> None:
    assert [_summary(r) for r in _replies(_request("twice", "a"))] == [("", "a", [1], False), ("", "a", [2], False)]
    replies = _replies(_request("twice", "a", empty_final=True))
    assert [_summary(r) for r in replies] == [("", "a", [1], False), ("", "a", [2], False), ("", "a", [], True)]
    assert replies[2].infer_response.model_name == "twice"
    assert [_summary(r) for r in _replies(_request("once", "b"))] == [("", "b", [12], True)]  # wire_bytes reached it


def test_errors_are_reported_in_the_stream_naming_the_request() -> None:
    [failed] = _replies(_request("missing", "c"))
    assert failed.error_message == "Request for unknown model: 'missing' is not found"
    assert (failed.infer_response.id, failed.infer_response.model_name) == ("c", "missing")
    assert FINAL not in failed.infer_response.parameters  # no response of the model: no final flag
    assert [_summary(r) for r in _replies(_request("midway", "d"))] == [("", "d", [1], False),
                                                                       ("broke midway", "d", [], True)]


def test_with_the_grpc_error_header_an_error_is_raised_not_reported() -> None:
    with pytest.raises(NotFound):
        _replies(_request("missing"), grpc_error=True)
    with pytest.raises(InternalError, match="broke midway"):
        _replies(_request("midway"), grpc_error=True)


def _message(model: str, id: str) -> bytes:
    return pb.ModelInferRequest(model_name=model, id=id).SerializeToString()


async def _messages(*messages: bytes, then: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    for message in messages:
        yield message
    if then is not None:  # a client that keeps its stream open
        await then.wait()


def test_a_stream_answers_its_requests_as_they_complete() -> None:
    async def run() -> list[tuple[str, str, list[int], bool | None]]:
        service = Service()
        servicer = Servicer(service)  # type: ignore[arg-type]
        stream = servicer.ModelStreamInfer(_messages(_message("slow", "first"), _message("once", "second")),
                                           Context())  # type: ignore[arg-type]
        replies = [pb.ModelStreamInferResponse.FromString(await anext(stream))]
        service.release.set()  # the slow request answers after the one behind it
        replies += [pb.ModelStreamInferResponse.FromString(reply) async for reply in stream]
        return [_summary(reply) for reply in replies]

    first, second = asyncio.run(run())
    assert (first[1], second[1]) == ("second", "first") and first[3] is True and second[3] is True


def test_a_message_that_does_not_parse_ends_the_stream_with_invalid_argument() -> None:
    async def run() -> list[bytes]:
        servicer = Servicer(Service())  # type: ignore[arg-type]
        return [reply async for reply in servicer.ModelStreamInfer(_messages(b"\xff\xff"), Context())]  # type: ignore[arg-type]

    with pytest.raises(InvalidInput, match="the request is not a valid protobuf inference.GRPCInferenceService."
                                           "ModelStreamInfer request message"):
        asyncio.run(run())


def test_the_grpc_error_header_ends_the_stream_at_its_first_error() -> None:
    async def run() -> list[bytes]:
        servicer = Servicer(Service())  # type: ignore[arg-type]
        stream = servicer.ModelStreamInfer(_messages(_message("missing", "x")), Context((GRPC_ERROR, "true")))  # type: ignore[arg-type]
        return [reply async for reply in stream]

    with pytest.raises(NotFound, match="'missing' is not found"):
        asyncio.run(run())


def test_a_drain_ends_an_open_stream_once_what_it_read_is_answered() -> None:
    async def run() -> list[pb.ModelStreamInferResponse]:
        service = Service()
        servicer = Servicer(service)  # type: ignore[arg-type]
        never = asyncio.Event()  # the client neither sends more nor closes
        stream = servicer.ModelStreamInfer(_messages(_message("slow", "read"), then=never), Context())  # type: ignore[arg-type]
        replies = asyncio.ensure_future(asyncio.wait_for(_all(stream), 10))
        await asyncio.sleep(0.05)  # the request is read and waits
        servicer.drain()
        service.release.set()
        return [pb.ModelStreamInferResponse.FromString(reply) for reply in await replies]

    [reply] = asyncio.run(run())
    assert _summary(reply)[1:] == ("read", [len(_message("slow", "read"))], True)


async def _all(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [reply async for reply in stream]
