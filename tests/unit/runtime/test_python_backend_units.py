"""Pure logic of decoupled models and python models: the response stream's rules, the BLS guard,
and auto-completion of a configuration by a python model (Triton's ``pb_utils.ModelConfig`` texts)."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.decoupled import ResponseStream
from kserve_v2.backend.local_calls import MAX_CALL_DEPTH, check_callers
from kserve_v2.protocol.errors import InvalidInput, Unavailable
from kserve_v2.runtime.python.config import ModelConfig, complete, config_json


def test_a_stream_delivers_in_order_from_any_thread_and_closes_with_the_final_flag() -> None:
    async def main() -> list:
        stream = ResponseStream(asyncio.get_running_loop())
        sender = threading.Thread(target=lambda: [stream.send({"OUT": np.array([i])}, final=i == 2) for i in range(3)])
        sender.start()
        sender.join()
        with pytest.raises(Unavailable, match="Response sender has been closed"):
            stream.send(None, final=True)
        got = [await stream.get() for _ in range(3)]
        assert stream.sent == 3 and stream.closed
        return [(int(item.outputs["OUT"][0]), item.final) for item in got if item is not None]

    assert asyncio.run(main()) == [(0, False), (1, False), (2, True)]


def test_a_cancelled_stream_drops_what_is_sent_after() -> None:
    async def main() -> tuple[bool, bool]:
        stream = ResponseStream(asyncio.get_running_loop())
        stream.cancel()
        stream.send({"OUT": np.array([1])})  # no error: the model may not have looked yet
        stream.ended()
        return stream.cancelled, await stream.get() is None

    assert asyncio.run(main()) == (True, True)


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_a_call_that_nests_too_deep_or_waits_for_its_own_callers_is_refused() -> None:
    two = _config('name: "a" instance_group [{ count: 2 }]')
    check_callers(("a",), "a", two)  # one caller holds one of two instances: it can still run
    with pytest.raises(InvalidInput, match=r"\(a -> a -> a\) while its callers hold all 2 of its instances"):
        check_callers(("a", "a"), "a", two)
    with pytest.raises(InvalidInput, match=f"nest deeper than {MAX_CALL_DEPTH}"):
        check_callers(("b",) * MAX_CALL_DEPTH, "a", two)
    check_callers(("e", "e"), "e", _config('name: "e" platform: "ensemble"'))  # an ensemble holds no instance


def test_auto_complete_adds_tensors_and_refuses_what_contradicts_the_configuration() -> None:
    config = _config('name: "m" backend: "python" input [{ name: "IN" data_type: TYPE_FP32 }]')
    model = ModelConfig(config_json(config))
    model.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    model.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    model.set_max_batch_size(8)
    model.set_dynamic_batching()
    model.set_model_transaction_policy({"decoupled": True})
    complete(config, model)
    assert [list(t.dims) for t in config.input] == [[4]] and config.output[0].name == "OUT"
    assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
    assert config.model_transaction_policy.decoupled
    again = ModelConfig(config_json(config))
    assert json.loads(config_json(config))["input"][0]["dims"] == [4]  # int64 as JSON numbers, as Triton gives them
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input 'IN', model provides "
                                         "TYPE_INT32"):
        again.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match=r"the model expects dims \[2\] but the model configuration specifies dims \[4\]"):
        again.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        again.set_max_batch_size(4)
    with pytest.raises(ValueError, match="contains property other than 'name', 'data_type', 'dims' and 'optional'"):
        again.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "shape": [1]})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        again.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="must return a valid pb.ModelConfig object"):
        complete(config, None)  # type: ignore[arg-type]


def test_a_response_iterator_serves_async_for_on_worker_threads() -> None:
    """``async for`` over a BLS response iterator (in the server and in a stub process) takes each response from a
    worker thread of the running loop, and ends where the iterator does."""
    from kserve_v2.runtime.python.pb_utils import ResponseIterator

    class Two(ResponseIterator):
        def __init__(self) -> None:
            self.left, self.threads = [1, 2], set()

        def __next__(self):  # noqa: ANN204 - the responses stand in for InferenceResponses
            self.threads.add(threading.current_thread().name)
            if not self.left:
                raise StopIteration
            return self.left.pop(0)

    async def collect(responses: Two) -> list:
        return [response async for response in responses]

    responses = Two()
    assert asyncio.run(collect(responses)) == [1, 2]
    assert threading.current_thread().name not in responses.threads
