"""Hostile single requests: shrunken shared memory, unparsable protobuf, values that fail
inside ONNX Runtime, an unload storm of unknown names. Each would crash, leak or mislabel on the old code.
"""

from __future__ import annotations

import json
import os

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from helpers import EXAMPLES, add_model, identity_model, make_model, start_server

BYTES_16 = 16 * 4  # sixteen INT32


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    for name in ("simple",):
        (repository / name).symlink_to(EXAMPLES / name)
    # Gather's indices come from the request: an index past the data fails inside ONNX Runtime
    gather = make_model([helper.make_node("Gather", ["DATA", "INDEX"], ["OUTPUT0"])],
                        [("DATA", TensorProto.FLOAT, [4]), ("INDEX", TensorProto.INT64, [1])],
                        [("OUTPUT0", TensorProto.FLOAT, [1])])
    add_model(repository, "gather", gather)
    # a string that passes every request check and then fails to parse as a number inside ONNX Runtime
    cast = make_model([helper.make_node("Cast", ["TEXT"], ["OUTPUT0"], to=TensorProto.FLOAT)],
                      [("TEXT", TensorProto.STRING, [1])], [("OUTPUT0", TensorProto.FLOAT, [1])])
    add_model(repository, "cast", cast)
    running = start_server(repository, tmp_path_factory.mktemp("logs"), "--allow-client-shm", "true",
                           "--model-control-mode", "explicit", "--load-model", "*")
    yield running
    assert running.stop() == 0


def test_shrinking_a_registered_region_gives_invalid_argument_not_sigbus(server) -> None:
    """Register, ``ftruncate`` the object to a page, infer: the old mmap-based reads died with SIGBUS."""
    key = f"/kv2_shrink_{os.getpid()}"
    handle = shm.create_shared_memory_region("shrink", key, 2 * BYTES_16 + 2 * 4096)
    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.register_system_shared_memory("shrink", key, 2 * BYTES_16 + 2 * 4096)
        os.truncate(f"/dev/shm{key}", 0)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("shrink", BYTES_16, offset=4096)
        inputs[1].set_shared_memory("shrink", BYTES_16, offset=4096 + BYTES_16)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", inputs)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "shrunk" in err.value.message() and key not in err.value.message()
        # an output into the shrunken region is refused the same way (the old code wrote through the mapping)
        good = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        for item in good:
            item.set_data_from_numpy(np.ones((1, 16), np.int32))
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("shrink", BYTES_16, offset=4096)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", good, outputs=[output])
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert server.proc.poll() is None
        assert client.is_server_live()
    finally:
        client.unregister_system_shared_memory("shrink")
        shm.destroy_shared_memory_region(handle)


def test_unparsable_protobuf_gets_invalid_argument_with_a_plain_message(server) -> None:
    """Bytes that are no ModelInferRequest: INVALID_ARGUMENT, not UNKNOWN with a Python class name."""
    with grpc.insecure_channel(server.url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            call(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Error" not in err.value.details() and "protobuf" in err.value.details()
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as err:
            list(stream(iter([b"\x0a\xff\xff\xff\xff\x0f"]), timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Error" not in err.value.details()


def test_values_that_fail_inside_onnx_runtime_are_invalid_argument_naming_the_input(server) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    data, index = grpcclient.InferInput("DATA", [4], "FP32"), grpcclient.InferInput("INDEX", [1], "INT64")
    data.set_data_from_numpy(np.arange(4, dtype=np.float32))
    index.set_data_from_numpy(np.array([99], np.int64))
    with pytest.raises(InferenceServerException) as err:
        client.infer("gather", [data, index])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INDEX" in err.value.message()
    index.set_data_from_numpy(np.array([2], np.int64))
    assert client.infer("gather", [data, index]).as_numpy("OUTPUT0").tolist() == [2.0]

    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"not a number"], dtype=object), binary_data=False)
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as err:
        http.infer("cast", [text])
    assert err.value.status() == "400" and "TEXT" in err.value.message()
    text.set_data_from_numpy(np.array([b"2.5"], dtype=object), binary_data=False)
    assert http.infer("cast", [text]).as_numpy("OUTPUT0").tolist() == [2.5]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_unloading_unknown_names_keeps_no_state(server) -> None:
    """Each distinct unknown name once left a lock behind for ever (+113 MB after 20,000 names)."""
    client = grpcclient.InferenceServerClient(server.url)
    for i in range(200):  # warm up allocator pools
        client.unload_model(f"warm-{i}-" + "x" * 10_000)
    before = _rss_kib(server.proc.pid)
    for i in range(2000):  # 10 kB names: a lock kept per name would hold 20 MB of them
        client.unload_model(f"nope-{i}-" + "x" * 10_000)
    grown = _rss_kib(server.proc.pid) - before
    assert grown < 8000, f"RSS grew {grown} KiB over 2,000 unknown names"
    assert client.is_model_ready("simple")


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    """An explicit-mode server with a model folder ``ident`` and a valid ONNX file outside every folder."""
    repository = tmp_path_factory.mktemp("repo")
    outside = tmp_path_factory.mktemp("host") / "outside.onnx"
    outside.write_bytes(identity_model(TensorProto.FLOAT).SerializeToString())
    folder = add_model(repository, "ident", identity_model(TensorProto.FLOAT))
    (folder / "1" / "link.onnx").symlink_to(outside)
    running = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit")
    yield running, outside
    assert running.stop() == 0


def test_config_override_paths_stay_inside_the_model_folder(explicit) -> None:
    """``default_model_filename`` absolute, with ``..``, or through a symlink: refused with one text, no host path."""
    server, outside = explicit
    client = grpcclient.InferenceServerClient(server.url)
    missing = outside.with_name("missing.onnx")
    depth = "../" * len(outside.parts)
    messages = {}
    for case, filename in {"absolute": str(outside), "absolute-missing": str(missing),
                           "dotdot": depth + str(outside)[1:], "dotdot-missing": depth + str(missing)[1:],
                           "symlink": "link.onnx"}.items():
        config = json.dumps({"default_model_filename": filename})
        with pytest.raises(InferenceServerException) as err:
            client.load_model("ident", config=config)
        messages[case] = err.value.message()
        assert "default_model_filename" in messages[case] and "ident" in messages[case], messages[case]
        assert str(outside.parent) not in messages[case]
        assert not client.is_model_ready("ident")
    assert messages["absolute"] == messages["absolute-missing"] == messages["dotdot"] == messages["dotdot-missing"]
    client.load_model("ident", config=json.dumps({"default_model_filename": "model.onnx"}))
    assert client.is_model_ready("ident")
