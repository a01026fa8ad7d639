"""kserve_v2.service.streaming in-process: the responses of one request to a decoupled model as they are
sent (order, id, the outputs asked for, final flags, errors, statistics by response index), a model
answered once, and a caller that stops reading; driven by a fake execution that sends on the request's
``ResponseStream`` (``kserve_v2.backend.decoupled``), with no server process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.decoupled import ResponseStream, Streamed
from kserve_v2.codec.messages import InferRequest, InferResponse, RequestedOutput, RequestHeader
from kserve_v2.models.version import ModelVersion
from kserve_v2.protocol.errors import InternalError, InvalidInput
from kserve_v2.protocol.statistics import RequestReport
from kserve_v2.scheduling.base import DirectScheduler
from kserve_v2.scheduling.instances import InstancePool
from kserve_v2.service.streaming import Answer, stream_request, stream_responses
from tests.unit.fakes import Doubling

DECOUPLED = ('name: "words" input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }] '
             'output [{ name: "A" data_type: TYPE_INT32 dims: [1] }, { name: "B" data_type: TYPE_INT32 dims: [1] },'
             ' { name: "R" data_type: TYPE_INT32 dims: [2] reshape { shape: [2] } }] '
             'model_transaction_policy { decoupled: true } instance_group [{ count: 1 }]')
ONE = {"A": np.array([1], np.int32), "B": np.array([2], np.int32)}
REPORT = RequestReport(1, 1, 1, 0, 0, 0, 0, 0)  # what an answer reports: not read by the stream


@pytest.fixture
def model() -> Iterator[ModelVersion]:
    """A decoupled version (its scheduler is never used: the fake execution stands for it)."""
    config = text_format.Parse(DECOUPLED, mc.ModelConfig())
    version = ModelVersion(config.name, 3, config, DirectScheduler(InstancePool(config.name, 3, 1, Doubling())))
    yield version
    version.close()


def request(*outputs: str) -> InferRequest:
    return InferRequest(RequestHeader("words", "", outputs=[RequestedOutput(name) for name in outputs]), id="r7")


Sending = Callable[[ResponseStream], object]


def run_sending(send: Sending, result: Answer | None = None) -> Callable[[ResponseStream], asyncio.Future[Answer]]:
    """A ``run`` whose execution takes the stream, calls ``send`` with it on a worker thread (as an
    instance thread would), then returns ``result``."""
    async def run(stream: ResponseStream) -> Answer:
        stream.take()
        await asyncio.to_thread(send, stream)
        return result or (InferResponse("words", "3"), REPORT)

    return run  # type: ignore[return-value]


def collect(model: ModelVersion, run: Callable[[ResponseStream], object], req: InferRequest | None = None,
            ) -> list[Streamed]:
    async def read() -> list[Streamed]:
        return [item async for item in stream_responses(run, req or request(), model)]  # type: ignore[arg-type]

    return asyncio.run(read())


def outputs(item: Streamed) -> dict[str, list[int]]:
    assert item.response is not None
    return {t.name: np.frombuffer(raw, "<i4").tolist()
            for t, raw in zip(item.response.outputs, item.response.raw_output_contents, strict=True)}


def test_each_sent_response_comes_in_order_with_the_request_id_and_the_outputs_asked_for(model: ModelVersion) -> None:
    def send(stream: ResponseStream) -> None:
        stream.send(ONE)
        stream.send({**ONE, "B": np.array([5], np.int32)}, parameters={"token": "x"})
        stream.send(None, final=True)

    items = collect(model, run_sending(send), request("B", "A"))
    assert [(i.response is not None, i.error, i.final) for i in items] == [(True, None, False), (True, None, False),
                                                                          (False, None, True)]
    assert [outputs(i) for i in items[:2]] == [{"B": [2], "A": [1]}, {"B": [5], "A": [1]}]
    assert [o.name for o in items[0].response.outputs] == ["B", "A"]  # the order asked for
    assert {(i.response.id, i.response.model_name, i.response.model_version) for i in items[:2]} == {("r7", "words", "3")}
    assert items[1].response.parameters["token"].value == "x" and not items[0].response.parameters
    responses = model.stats.responses
    assert (responses["0"].success.count, responses["1"].success.count) == (1, 1)
    assert responses["2"].empty_response.count == 1  # the final flag alone


def test_a_request_naming_no_output_gets_every_output_the_model_sent(model: ModelVersion) -> None:
    items = collect(model, run_sending(lambda stream: stream.send(ONE, final=True)))
    assert len(items) == 1 and items[0].final and outputs(items[0]) == {"A": [1], "B": [2]}


def test_an_error_response_and_an_output_the_response_cannot_carry_fail_that_response_only(model: ModelVersion) -> None:
    def send(stream: ResponseStream) -> None:
        stream.send(None, InvalidInput("bad step"))
        stream.send({"R": np.arange(3, dtype=np.int32)})  # three values for a [2] reshape
        stream.send(ONE, final=True)

    items = collect(model, run_sending(send))
    assert [type(i.error) for i in items] == [InvalidInput, ValueError, type(None)]
    assert str(items[0].error) == "bad step" and items[2].final and outputs(items[2]) == {"A": [1], "B": [2]}
    responses = model.stats.responses
    assert (responses["0"].fail.count, responses["1"].fail.count, responses["2"].success.count) == (1, 1, 1)


def test_a_failure_before_any_response_is_raised_and_one_after_is_a_final_error(model: ModelVersion) -> None:
    async def fails_at_once(stream: ResponseStream) -> Answer:
        stream.take()
        raise InternalError("no start")

    with pytest.raises(InternalError, match="no start"):
        collect(model, fails_at_once)

    async def fails_later(stream: ResponseStream) -> Answer:
        stream.take()
        stream.send(ONE)
        await asyncio.sleep(0)
        raise InternalError("broke midway")

    items = collect(model, fails_later)
    assert [(i.response is not None, i.final) for i in items] == [(True, False), (False, True)]
    assert str(items[1].error) == "broke midway"


def test_an_execution_that_does_not_take_the_stream_is_its_one_response(model: ModelVersion) -> None:
    answer = InferResponse("words", "3", "r7")

    async def once(stream: ResponseStream) -> Answer:
        return answer, REPORT

    [item] = collect(model, once)
    assert item.response is answer and item.final and item.error is None


def test_a_caller_that_stops_reading_cancels_the_request(model: ModelVersion) -> None:
    seen: list[ResponseStream] = []
    ended = asyncio.Event()

    async def endless(stream: ResponseStream) -> Answer:
        stream.take()
        seen.append(stream)
        try:
            while True:
                stream.send(ONE)
                await asyncio.sleep(0.001)
        finally:
            ended.set()

    async def read_one() -> Streamed:
        responses = stream_responses(endless, request(), model)
        first = await anext(responses)
        await responses.aclose()  # the caller goes away before the final response
        await asyncio.wait_for(ended.wait(), 10)
        return first

    first = asyncio.run(read_one())
    assert not first.final and seen[0].cancelled
    seen[0].send(ONE)  # dropped, not an error: the model may still be sending from its own thread


def test_the_stream_ends_at_the_final_flag_while_the_execution_still_runs(model: ModelVersion) -> None:
    async def answers_then_works(stream: ResponseStream) -> Answer:
        stream.take()
        stream.send(ONE, final=True)
        await asyncio.sleep(0.2)  # cleanup after the final response
        return InferResponse("words", "3"), REPORT

    async def read() -> tuple[list[Streamed], bool]:
        started = asyncio.get_running_loop().time()
        items = [item async for item in stream_responses(answers_then_works, request(), model)]
        return items, asyncio.get_running_loop().time() - started < 0.2

    items, early = asyncio.run(read())
    assert [i.final for i in items] == [True] and early


def test_stream_request_holds_the_version_until_the_execution_is_over(model: ModelVersion) -> None:
    config = text_format.Parse(DECOUPLED.replace("model_transaction_policy { decoupled: true }", ""), mc.ModelConfig())
    once = ModelVersion("once", 1, config, DirectScheduler(InstancePool("once", 1, 1, Doubling())))
    versions = {"words": model, "once": once}
    held: list[int] = []

    def acquire(name: str, version: str) -> ModelVersion:
        versions[name].hold()
        return versions[name]

    async def answer_once(version: ModelVersion, req: InferRequest, *, wire_bytes: int | None = None) -> Answer:
        held.append(version.inflight)
        return InferResponse(version.name, version.label, req.id), REPORT

    async def run_with(req: InferRequest, version: ModelVersion, api: str, raw: bool, wire_bytes: int | None,
                       stream: ResponseStream | None) -> Answer:
        assert stream is not None and raw and wire_bytes == 12
        held.append(version.inflight)
        stream.take()
        stream.send(ONE, final=True)
        return InferResponse(version.name, version.label), REPORT

    async def read(name: str) -> list[Streamed]:
        req = InferRequest(RequestHeader(name, ""), id="q")
        items = [item async for item in stream_request(req, 12, acquire, answer_once, run_with)]
        await asyncio.sleep(0.01)  # the execution returns after its final response
        return items

    try:
        [one] = asyncio.run(read("once"))
        [streamed] = asyncio.run(read("words"))
    finally:
        once.close()
    assert one.final and one.response is not None and (one.response.model_name, one.response.id) == ("once", "q")
    assert streamed.final and outputs(streamed) == {"A": [1], "B": [2]}
    assert held == [1, 1] and once.inflight == 0 and model.inflight == 0  # held while running, released after
