"""Sequence batching as Triton does it, through real servers and unmodified tritonclient (gRPC, HTTP,
asyncio, streaming): control tensors, implicit state, direct padding, oldest batching, idle expiry,
backlog, and Triton's texts."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from helpers import add_model, make_model, start_server, wait_pending

INT32 = TensorProto.INT32
ONE = [None, 1]
VALUES = [11, 7, 5, 3, 2, 0, 1]  # Triton's sequence client examples


def _flag(name: str, kind: str, values: str = "int32_false_true: [0, 1]") -> str:
    return f'{{ name: "{name}" control [{{ kind: CONTROL_SEQUENCE_{kind} {values} }}] }}'


def _probe_model():
    """OUTPUT = READY * (INPUT + START); ROWS = rows in the execution; READIES = rows with READY = 1."""
    axes = helper.make_tensor("AXES", TensorProto.INT64, [1], [0])
    zero = helper.make_tensor("ZERO", INT32, [], [0])
    one = helper.make_tensor("ONE", INT32, [], [1])
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["started"]),
             helper.make_node("Mul", ["READY", "started"], ["OUTPUT"]),
             helper.make_node("Mul", ["READY", "ZERO"], ["zeros"]),
             helper.make_node("Add", ["zeros", "ONE"], ["ones"]),
             helper.make_node("ReduceSum", ["ones", "AXES"], ["rows"], keepdims=1),
             helper.make_node("ReduceSum", ["READY", "AXES"], ["readies"], keepdims=1),
             helper.make_node("Shape", ["INPUT"], ["shape"]),
             helper.make_node("Expand", ["rows", "shape"], ["ROWS"]),
             helper.make_node("Expand", ["readies", "shape"], ["READIES"])]
    model = make_model(nodes, [("INPUT", INT32, ONE), ("START", INT32, ONE), ("READY", INT32, ONE)],
                       [("OUTPUT", INT32, ONE), ("ROWS", INT32, ONE), ("READIES", INT32, ONE)])
    model.graph.initializer.extend([axes, zero, one])
    return model


def _accumulator_model():
    """STATE_OUT = STATE_IN + INPUT, OUTPUT = STATE_OUT."""
    return make_model([helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
                       helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])],
                      [("INPUT", INT32, ONE), ("STATE_IN", INT32, ONE)],
                      [("OUTPUT", INT32, ONE), ("STATE_OUT", INT32, ONE)])


def _controls_model():
    """Without batching ([1] tensors): each control as the model received it."""
    return make_model([helper.make_node("Cast", ["S"], ["OS"], to=TensorProto.FLOAT),
                       helper.make_node("Identity", ["E"], ["OE"]),
                       helper.make_node("Identity", ["R"], ["OR"]),
                       helper.make_node("Identity", ["C"], ["OC"]),
                       helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
                      [("INPUT", INT32, [1]), ("S", TensorProto.BOOL, [1]), ("E", TensorProto.FLOAT, [1]),
                       ("R", INT32, [1]), ("C", TensorProto.INT64, [1])],
                      [("OUTPUT", INT32, [1]), ("OS", TensorProto.FLOAT, [1]), ("OE", TensorProto.FLOAT, [1]),
                       ("OR", INT32, [1]), ("OC", TensorProto.INT64, [1])])


ACC_STATE = ('state [{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [1] '
             'initial_state { data_type: TYPE_INT32 dims: [1] zero_data: true name: "zero" } }]')
ONE_INSTANCE = "instance_group [{ kind: KIND_CPU count: 1 }]\n"


@pytest.fixture(scope="module")
def sequence_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    probe_controls = f"control_input [{_flag('START', 'START')}, {_flag('READY', 'READY')}]"
    add_model(repository, "probe_direct", _probe_model(),
              f"max_batch_size: 4\n{ONE_INSTANCE}sequence_batching {{ max_sequence_idle_microseconds: 30000000 "
              f"direct {{}} {probe_controls} }}")
    add_model(repository, "probe_oldest", _probe_model(),
              f"max_batch_size: 4\n{ONE_INSTANCE}sequence_batching {{ max_sequence_idle_microseconds: 30000000 "
              "oldest { max_candidate_sequences: 16 preferred_batch_size: [4] max_queue_delay_microseconds: 5000000 } "
              f"{probe_controls} }}")
    add_model(repository, "stats_oldest", _probe_model(),
              f"max_batch_size: 4\n{ONE_INSTANCE}sequence_batching {{ max_sequence_idle_microseconds: 30000000 "
              "oldest { max_candidate_sequences: 8 preferred_batch_size: [4] max_queue_delay_microseconds: 2000000 } "
              f"{probe_controls} }}")
    add_model(repository, "acc", _accumulator_model(),
              "max_batch_size: 8\ninstance_group [{ kind: KIND_CPU count: 2 }]\nsequence_batching { "
              f"max_sequence_idle_microseconds: 60000000 oldest {{ max_candidate_sequences: 32 "
              f"max_queue_delay_microseconds: 1000 }} {ACC_STATE} }}")
    add_model(repository, "acc_idle", _accumulator_model(),
              f"max_batch_size: 8\n{ONE_INSTANCE}sequence_batching {{ max_sequence_idle_microseconds: 1000000 "
              f"{ACC_STATE} }}")
    controls = ", ".join([_flag("S", "START", "bool_false_true: [false, true]"),
                          _flag("E", "END", "fp32_false_true: [0.5, 2.5]"),
                          _flag("R", "READY", "int32_false_true: [7, 9]"),
                          _flag("C", "CORRID", "data_type: TYPE_INT64")])
    add_model(repository, "controls", _controls_model(),
              f"max_batch_size: 0\n{ONE_INSTANCE}sequence_batching {{ max_sequence_idle_microseconds: 30000000 "
              f"control_input [{controls}] }}")
    add_model(repository, "broken", _accumulator_model(),
              f'max_batch_size: 8\nsequence_batching {{ control_input [{_flag("START", "START")}] {ACC_STATE} }}')
    for name, data in (("acc_file", np.array([100], np.int32).tobytes()), ("acc_bad_file", b"\x01\x02")):
        state = ACC_STATE.replace("zero_data: true", 'data_file: "hundred"')
        folder = add_model(repository, name, _accumulator_model(),
                           f"max_batch_size: 8\n{ONE_INSTANCE}sequence_batching {{ {state} }}")
        (folder / "initial_state").mkdir()
        (folder / "initial_state" / "hundred").write_bytes(data)
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--strict-readiness", "false",
                          "--exit-on-error=false")  # the bad configurations fail to load
    yield server
    assert server.stop() == 0


def _inputs(module, value: int, shape: list[int] | None = None) -> list:
    shape = shape or [1, 1]
    tensor = module.InferInput("INPUT", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, np.int32))
    return [tensor]


def _step(client, model: str, value: int, sequence_id, start: bool = False, end: bool = False,
          output: str = "OUTPUT") -> int:
    result = client.infer(model, _inputs(grpcclient, value), sequence_id=sequence_id, sequence_start=start,
                          sequence_end=end)
    return int(result.as_numpy(output).reshape(-1)[0])


def _sequence(client, module, model: str, sequence_id, values: list[int]) -> list[int]:
    """Triton's ``sync_send``: START on the first request, END on the last."""
    out = []
    for i, value in enumerate(values):
        result = client.infer(model, _inputs(module, value), sequence_id=sequence_id, sequence_start=i == 0,
                              sequence_end=i == len(values) - 1)
        out.append(int(result.as_numpy("OUTPUT")[0][0]))
    return out


# ---- Triton's sequence client examples on the example repository ---------------------------------


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_triton_sequence_client_flow(example_server, module, dyna: bool) -> None:
    """simple_{grpc,http}_sequence_sync_infer_client.py (and ``-d``): two int ids and a string id."""
    url = example_server.url if module is grpcclient else example_server.http_url
    int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
    string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    string_id = "1002" if dyna else str(uuid.uuid4())
    offset = 10 if module is grpcclient else 20  # own ids per case: the example server is shared
    id0, id1 = 1000 + offset, 1001 + offset
    with module.InferenceServerClient(url) as client:
        seq0 = _sequence(client, module, int_model, id0, [0] + VALUES)
        seq1 = _sequence(client, module, int_model, id1, [100] + [-v for v in VALUES])
        strings = _sequence(client, module, string_model, string_id, [20] + [-v for v in VALUES])
    for i in range(len(seq0)):
        expected0 = 1 if i == 0 else VALUES[i - 1]
        expected1 = 101 if i == 0 else -VALUES[i - 1]
        if dyna:
            expected_string = 20 if i == 0 else strings[i - 1] - VALUES[i - 1]
        else:
            expected_string = 21 if i == 0 else -VALUES[i - 1]
        if dyna and i == len(seq0) - 1:  # END adds the correlation id
            expected0, expected1, expected_string = expected0 + id0, expected1 + id1, expected_string + int(string_id)
        assert (seq0[i], seq1[i], strings[i]) == (expected0, expected1, expected_string), i


def test_triton_stream_flow_matches_responses_by_id(example_server) -> None:
    """simple_grpc_sequence_stream_infer_client.py: interleaved int and string ids on one stream, ids echoed."""
    responses: queue.Queue = queue.Queue()
    sequences = {3000: [0] + VALUES, "stream-" + uuid.uuid4().hex: [100] + [-v for v in VALUES]}
    with grpcclient.InferenceServerClient(example_server.url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for step in range(len(VALUES) + 1):
            for sequence_id, values in sequences.items():
                client.async_stream_infer("simple_sequence", _inputs(grpcclient, values[step]),
                                          request_id=f"{sequence_id}_{step}", sequence_id=sequence_id,
                                          sequence_start=step == 0, sequence_end=step == len(VALUES))
        got = {}
        for _ in range(2 * (len(VALUES) + 1)):
            result, error = responses.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
        client.stop_stream()
    for sequence_id, values in sequences.items():
        for step, value in enumerate(values):
            assert got[f"{sequence_id}_{step}"] == value + (step == 0)


def test_aio_stream_sequences(example_server) -> None:
    """simple_grpc_aio_sequence_stream_infer_client.py: asyncio stream_infer on simple_dyna_sequence."""

    async def run() -> dict[str, int]:
        async def requests():
            for step in range(3):
                for sequence_id in (4000, 4001):
                    yield {"model_name": "simple_dyna_sequence", "inputs": _inputs(aioclient, step + 1),
                           "request_id": f"{sequence_id}_{step}", "sequence_id": sequence_id,
                           "sequence_start": step == 0, "sequence_end": step == 2}

        async with aioclient.InferenceServerClient(example_server.url) as client:
            got = {}
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
                if len(got) == 6:
                    break
            return got

    got = asyncio.run(run())
    for sequence_id in (4000, 4001):
        assert [got[f"{sequence_id}_{s}"] for s in range(3)] == [2, 2, 3 + sequence_id]


def test_stream_reports_a_failed_request_and_stays_open(example_server) -> None:
    """A request of the stream without START fails in its own response (request id echoed); the rest succeed."""

    def request(request_id: str, sequence_id: int, value: int, start: bool) -> service_pb2.ModelInferRequest:
        message = service_pb2.ModelInferRequest(model_name="simple_sequence", id=request_id)
        message.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
        message.raw_input_contents.append(np.array([[value]], np.int32).tobytes())
        message.parameters["sequence_id"].int64_param = sequence_id
        message.parameters["sequence_start"].bool_param = start
        return message

    with grpc.insecure_channel(example_server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        sent = [request("a", 5001, 4, True), request("lost", 5999, 1, False), request("b", 5001, 6, False)]
        responses = list(stub.ModelStreamInfer(iter(sent), timeout=30))
    by_id = {r.infer_response.id: r for r in responses}
    assert set(by_id) == {"a", "lost", "b"}
    assert by_id["lost"].error_message == ("inference request for sequence 5999 to model 'simple_sequence' must "
                                           "specify the START flag on the first request of the sequence")
    assert by_id["a"].error_message == by_id["b"].error_message == ""
    assert np.frombuffer(by_id["b"].infer_response.raw_output_contents[0], np.int32)[0] == 6


# ---- Triton's error texts ---------------------------------------------------------------------


def test_sequence_errors_have_tritons_texts(example_server) -> None:
    with grpcclient.InferenceServerClient(example_server.url) as client:
        cases = [
            (dict(sequence_id=6001), "inference request for sequence 6001 to model 'simple_sequence' must specify "
                                     "the START flag on the first request of the sequence"),
            (dict(sequence_id="never-started"), "inference request for sequence never-started to model "
                                                "'simple_sequence' must specify the START flag"),
            (dict(), "inference request to model 'simple_sequence' must specify a non-zero or non-empty "
                     "correlation ID"),
        ]
        for kwargs, text in cases:
            with pytest.raises(InferenceServerException) as caught:
                client.infer("simple_sequence", _inputs(grpcclient, 1), **kwargs)
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert text in caught.value.message()
        with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of "
                                                           "sequence batcher"):
            client.infer("simple_sequence", _inputs(grpcclient, 1, [2, 1]), sequence_id=6002, sequence_start=True)
        with pytest.raises(InferenceServerException, match="sequence batching control 'CORRID' data-type is 'BYTES', "
                                                           "but model 'simple_dyna_sequence' expects 'UINT64'"):
            client.infer("simple_dyna_sequence", _inputs(grpcclient, 1), sequence_id="6003", sequence_start=True)
        with pytest.raises(InferenceServerException, match="sequence batching control 'CORRID' data-type is 'UINT64', "
                                                           "but model 'simple_string_dyna_sequence' expects 'BYTES'"):
            client.infer("simple_string_dyna_sequence", _inputs(grpcclient, 1), sequence_id=6004, sequence_start=True)
        # END forgets the sequence: its id needs a new START
        assert _step(client, "simple_sequence", 5, 6005, start=True, end=True) == 6
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            _step(client, "simple_sequence", 5, 6005)
        # a model without sequence batching ignores the sequence parameters, as Triton's other schedulers do
        both = grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        for tensor in both:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        result = client.infer("simple", list(both), sequence_id=6006, sequence_start=True)
        assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]


# ---- controls, batching strategies, state -----------------------------------------------------


def test_control_values_and_datatypes_as_configured(sequence_server) -> None:
    """bool / fp32 / int32 false-true pairs and an INT64 CORRID reach the model, unbatched ([1] tensors)."""
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        def step(**flags) -> tuple:
            result = client.infer("controls", _inputs(grpcclient, 3, [1]), sequence_id=77, **flags)
            return tuple(result.as_numpy(name).tolist() for name in ("OUTPUT", "OS", "OE", "OR", "OC"))

        assert step(sequence_start=True) == ([3], [1.0], [0.5], [9], [77])
        assert step() == ([3], [0.0], [0.5], [9], [77])
        assert step(sequence_end=True) == ([3], [0.0], [2.5], [9], [77])


def test_direct_pads_empty_slots_with_ready_false(sequence_server) -> None:
    """Direct: sequence A holds slot 0, B slot 1; a request of B alone runs as 2 rows, slot 0 READY = 0, and
    batch_stats count it as an execution of 2."""
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        before = _batch_stats(client.get_inference_statistics("probe_direct"))
        assert _step(client, "probe_direct", 10, 801, start=True) == 11
        assert _step(client, "probe_direct", 20, 802, start=True) == 21
        assert _step(client, "probe_direct", 5, 802, output="ROWS") == 2
        assert _step(client, "probe_direct", 5, 802, output="READIES") == 1
        assert _step(client, "probe_direct", 6, 802, end=True) == 6
        assert _step(client, "probe_direct", 7, 801, end=True) == 7
        after = _batch_stats(client.get_inference_statistics("probe_direct"))
    # batch_stats count padded executions by their rows, as Triton's direct scheduler does (a lone request in
    # slot 1 runs as 2 rows): A's two requests alone in slot 0, B's four with slot 0 padded
    assert {size: after[size] - before.get(size, 0) for size in after} == {1: 2, 2: 4}


def test_oldest_batches_requests_of_different_sequences(sequence_server) -> None:
    """Oldest: four sequences' requests form one execution of 4 rows (preferred size 4), all READY."""
    ids = [901, 902, 903, 904]

    async def run() -> list[tuple[int, int, int]]:
        async with aioclient.InferenceServerClient(sequence_server.url) as client:
            async def one(sequence_id: int) -> tuple[int, int, int]:
                result = await client.infer("probe_oldest", _inputs(aioclient, sequence_id), sequence_id=sequence_id,
                                            sequence_start=True, sequence_end=True)
                return tuple(int(result.as_numpy(n)[0][0]) for n in ("OUTPUT", "ROWS", "READIES"))

            return await asyncio.gather(*(one(i) for i in ids))

    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        before = client.get_inference_statistics("probe_oldest").model_stats[0]
        assert asyncio.run(run()) == [(i + 1, 4, 4) for i in ids]
        after = client.get_inference_statistics("probe_oldest").model_stats[0]
    assert after.inference_count - before.inference_count == 4
    assert after.execution_count - before.execution_count == 1


def _batch_stats(stats) -> dict[int, int]:
    """{batch size: executions} of one model's statistics, from the gRPC message or the HTTP JSON."""
    if isinstance(stats, dict):
        return {s["batch_size"]: s["compute_infer"]["count"] for s in stats["model_stats"][0]["batch_stats"]}
    return {s.batch_size: s.compute_infer.count for s in stats.model_stats[0].batch_stats}


def test_oldest_batch_stats_count_executions_by_their_rows(sequence_server) -> None:
    """L0_dyna_sequence_batcher's check: four sequences of 3, 3, 3 and 2 steps sent round by round (each round
    once the last has answered) run as executions of 4, 4 and 3 rows (preferred size 4, the round of 3 after
    the queue delay); batch_stats count them so, inference_count counts requests."""
    steps = {1001: 3, 1002: 3, 1003: 3, 1004: 2}

    async def run() -> list[list[int]]:
        async with aioclient.InferenceServerClient(sequence_server.url) as client:
            async def one(sequence_id: int, step: int) -> int:
                result = await client.infer("stats_oldest", _inputs(aioclient, step), sequence_id=sequence_id,
                                            sequence_start=step == 0, sequence_end=step == steps[sequence_id] - 1)
                return int(result.as_numpy("ROWS")[0][0])

            return [await asyncio.gather(*(one(i, step) for i, n in steps.items() if step < n)) for step in range(3)]

    assert asyncio.run(run()) == [[4] * 4, [4] * 4, [3] * 3]
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        stats = client.get_inference_statistics("stats_oldest")
    with httpclient.InferenceServerClient(sequence_server.http_url) as client:
        rest = client.get_inference_statistics("stats_oldest")
    assert _batch_stats(stats) == _batch_stats(rest) == {3: 1, 4: 2}
    assert (stats.model_stats[0].execution_count, stats.model_stats[0].inference_count) == (3, 11)


def test_state_isolated_across_32_concurrent_sequences(sequence_server) -> None:
    """32 sequences x 100 steps on the implicit-state accumulator, int and string ids mixed: every value is the
    sequence's own running sum; then a new START on a used id starts from zero again."""
    steps = 100

    async def run() -> None:
        async with aioclient.InferenceServerClient(sequence_server.url) as client:
            async def one(k: int) -> None:
                sequence_id = 10_000 + k if k % 2 else f"state-{k}"
                total = 0
                for step in range(steps):
                    value = (k * 7 + step * 13) % 51 - 25
                    total += value
                    result = await client.infer("acc", _inputs(aioclient, value), sequence_id=sequence_id,
                                                sequence_start=step == 0, sequence_end=step == steps - 1)
                    assert int(result.as_numpy("OUTPUT")[0][0]) == total, (sequence_id, step)

            await asyncio.gather(*(one(k) for k in range(32)))

    asyncio.run(run())
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        assert _step(client, "acc", 5, 10_001, start=True) == 5
        assert _step(client, "acc", 6, 10_001) == 11
        assert _step(client, "acc", 1, 10_001, start=True) == 1  # START resets the state
        assert _step(client, "acc", 2, 10_001, end=True) == 3
        stats = client.get_inference_statistics("acc").model_stats[0]
    assert stats.inference_count == 32 * steps + 4
    assert stats.execution_count < stats.inference_count  # sequences shared executions


def test_idle_sequence_expires_and_frees_its_state(sequence_server) -> None:
    """After max_sequence_idle_microseconds (1 s) without requests the sequence is gone; a new START is fresh."""
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        assert _step(client, "acc_idle", 4, 4242, start=True) == 4
        assert _step(client, "acc_idle", 4, 4242) == 8
        time.sleep(3.5)  # idle: the duration is the feature (any request to 4242 would keep it alive)
        with pytest.raises(InferenceServerException, match="inference request for sequence 4242 to model "
                                                           "'acc_idle' must specify the START flag"):
            _step(client, "acc_idle", 4, 4242)
        assert _step(client, "acc_idle", 4, 4242, start=True) == 4


def test_backlogged_sequence_waits_for_a_slot(sequence_server) -> None:
    """One instance without batching has one slot: a second sequence waits until the first one ends."""
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        assert client.infer("controls", _inputs(grpcclient, 1, [1]), sequence_id=1,
                            sequence_start=True).as_numpy("OUTPUT").tolist() == [1]
        done: queue.Queue = queue.Queue()
        client.async_infer("controls", _inputs(grpcclient, 2, [1]), lambda result, error: done.put((result, error)),
                           sequence_id=2, sequence_start=True, sequence_end=True)
        wait_pending(sequence_server, "controls", 1)  # it has reached the server, and there it waits
        with pytest.raises(queue.Empty):
            done.get(timeout=0.5)
        client.infer("controls", _inputs(grpcclient, 1, [1]), sequence_id=1, sequence_end=True)
        result, error = done.get(timeout=30)
        assert error is None and result.as_numpy("OC").tolist() == [2]


def test_bad_sequence_configuration_fails_the_load_with_a_reason(sequence_server) -> None:
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        rows = {m.name: m for m in client.get_model_repository_index().models}
        assert not client.is_model_ready("broken")
    assert rows["broken"].state == rows["acc_bad_file"].state == "UNAVAILABLE"
    assert rows["broken"].reason.endswith("configuration specified sequence control 'START', but model does not "
                                          "provide that input")
    assert "input byte size mismatch for initial state file 'hundred'" in rows["acc_bad_file"].reason


def test_initial_state_from_a_data_file(sequence_server) -> None:
    """initial_state { data_file } is read from the model's initial_state/ folder, and START returns to it."""
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        assert _step(client, "acc_file", 1, 31, start=True) == 101
        assert _step(client, "acc_file", 2, 31) == 103
        assert _step(client, "acc_file", 3, 31, start=True, end=True) == 103
        assert "sequence" in client.get_server_metadata().extensions


def test_http_sequences_share_the_grpc_sequence_state(sequence_server) -> None:
    """REST requests carry the same parameters into the same sequences: a sequence started over gRPC goes on over HTTP."""
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        assert _step(client, "acc", 3, "mixed", start=True) == 3
    with httpclient.InferenceServerClient(sequence_server.http_url) as client:
        result = client.infer("acc", _inputs(httpclient, 4), sequence_id="mixed", sequence_end=True)
        assert result.as_numpy("OUTPUT").tolist() == [[7]]
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            client.infer("acc", _inputs(httpclient, 4), sequence_id="mixed")
        # ids are uint64: JSON carries 2**64 - 1, gRPC's int64 parameter carries it as -1
        assert client.infer("acc", _inputs(httpclient, 2), sequence_id=2**64 - 1,
                            sequence_start=True).as_numpy("OUTPUT").tolist() == [[2]]
    with grpcclient.InferenceServerClient(sequence_server.url) as client:
        assert _step(client, "acc", 3, -1, end=True) == 5


def test_threads_of_one_sequence_keep_order(sequence_server) -> None:
    """Requests sent one after another by several client threads on different sequences keep each order."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            with grpcclient.InferenceServerClient(sequence_server.url) as client:
                for step in range(10):
                    assert _step(client, "acc", 1, 20_000 + k, start=step == 0, end=step == 9) == step + 1
        except BaseException as err:  # noqa: BLE001 - reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_sequences_hold_no_memory_after_end_or_expiry(tmp_path) -> None:
    """Four sequences each keep a 40 MiB state; END (and, for others, idle expiry) gives the memory back."""
    size = 10 * 1024 * 1024  # FP32 elements: 40 MiB per state
    model = make_model([helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
                        helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
                       [("INPUT", TensorProto.FLOAT, ONE), ("STATE_IN", TensorProto.FLOAT, [None, size])],
                       [("OUTPUT", TensorProto.FLOAT, ONE), ("STATE_OUT", TensorProto.FLOAT, [None, size])])
    add_model(tmp_path / "repo", "big_state", model,
              f"max_batch_size: 1\n{ONE_INSTANCE}parameters {{ key: \"enable_mem_arena\" value {{ string_value: \"0\" }} }}\n"
              "sequence_batching { max_sequence_idle_microseconds: 5000000 oldest { max_candidate_sequences: 8 } "
              f'state [{{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [{size}] }}] }}')
    server = start_server(tmp_path / "repo", tmp_path / "logs")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            def step(sequence_id: int, **flags) -> None:
                tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
                client.infer("big_state", [tensor], sequence_id=sequence_id, **flags)

            for rounds, close in ((0, "end"), (1, "expiry")):
                baseline = _rss_mib(server.proc.pid)
                for sequence_id in range(1, 5):
                    step(sequence_id, sequence_start=True)
                held = _rss_mib(server.proc.pid)
                assert held - baseline > 120, (rounds, baseline, held)
                if close == "end":
                    for sequence_id in range(1, 5):
                        step(sequence_id, sequence_end=True)
                # END frees at once; expiry after 5 s idle and the reaper's next look
                deadline = time.monotonic() + (0 if close == "end" else 30)
                while (released := _rss_mib(server.proc.pid)) - baseline >= 40 and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert released - baseline < 40, (close, baseline, held, released)
    finally:
        assert server.stop() == 0
