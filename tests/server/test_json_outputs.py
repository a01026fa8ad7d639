"""Every V2 datatype as a REST output, JSON and binary, alone and beside the others, through a real
server and unmodified tritonclient.http (Triton's binary tensor data extension decides per output).

BF16 has its own model: ONNX Runtime's Python API cannot run a graph with both a string input and
a bfloat16 tensor (a string OrtValue cannot be made from Python), so ``all_types`` holds the other 13."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import helper
from tritonclient.utils import InferenceServerException

from helpers import ONNX_TYPES, Server, add_model, make_model, sample, start_server

NO_JSON = ("FP16", "BF16")  # Triton sends these only as binary data
TOGETHER = [t for t in ONNX_TYPES if t != "BF16"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``all_types``: IN_<datatype> -> OUT_<datatype> identities of shape [2, 3], one per datatype
    but BF16; ``bf16``: the same for BF16 alone."""
    repository = tmp_path_factory.mktemp("repo")
    for name, types in (("all_types", TOGETHER), ("bf16", ["BF16"])):
        model = make_model([helper.make_node("Identity", [f"IN_{t}"], [f"OUT_{t}"]) for t in types],
                           [(f"IN_{t}", ONNX_TYPES[t], [2, 3]) for t in types],
                           [(f"OUT_{t}", ONNX_TYPES[t], [2, 3]) for t in types])
        add_model(repository, name, model)
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def _infer(server: Server, binary: dict[str, bool]) -> httpclient.InferResult:
    """Send every input of the model (binary) and ask for the outputs of ``binary``: datatype -> as binary data."""
    model = "bf16" if "BF16" in binary else "all_types"
    inputs = []
    for datatype in ["BF16"] if "BF16" in binary else TOGETHER:
        tensor = httpclient.InferInput(f"IN_{datatype}", [2, 3], datatype)
        tensor.set_data_from_numpy(sample(datatype), binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(f"OUT_{t}", binary_data=b) for t, b in binary.items()]
    with httpclient.InferenceServerClient(server.http_url) as client:
        return client.infer(model, inputs, outputs=outputs)


def _check(result: httpclient.InferResult, binary: dict[str, bool]) -> None:
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == [f"OUT_{t}" for t in binary]
    for output, (datatype, as_binary) in zip(response["outputs"], binary.items(), strict=True):
        assert output["datatype"] == datatype and output["shape"] == [2, 3]
        assert ("data" in output) is not as_binary, output
        got, expected = result.as_numpy(f"OUT_{datatype}"), sample(datatype)
        if datatype == "BYTES":  # JSON carries text, binary data the elements' bytes
            assert [v if isinstance(v, bytes) else v.encode() for v in got.reshape(-1)] == expected.reshape(-1).tolist()
        else:
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("datatype", list(ONNX_TYPES))
@pytest.mark.parametrize("as_binary", [True, False], ids=["binary", "json"])
def test_each_datatype_alone(server: Server, datatype: str, as_binary: bool) -> None:
    binary = {datatype: as_binary}
    if datatype in NO_JSON and not as_binary:
        with pytest.raises(InferenceServerException) as raised:
            _infer(server, binary)
        assert raised.value.status() == "400"
        assert raised.value.message() == (f"sending {datatype} data via JSON is not supported. Please use the "
                                          f"binary data format for output OUT_{datatype}")  # Triton's text
        return
    _check(_infer(server, binary), binary)


@pytest.mark.parametrize("layout", ["binary", "json", "alternating", "alternating_other_way"])
def test_every_datatype_together(server: Server, layout: str) -> None:
    """13 outputs in one response: all binary, all JSON (FP16 binary), or alternating, so that
    BYTES in JSON sits beside numeric JSON and binary outputs."""
    binary = {}
    for index, datatype in enumerate(TOGETHER):
        wanted = {"binary": True, "json": False, "alternating": index % 2 == 0,
                  "alternating_other_way": index % 2 == 1}[layout]
        binary[datatype] = wanted or datatype in NO_JSON
    _check(_infer(server, binary), binary)


def test_json_inputs_and_outputs(server: Server) -> None:
    """JSON inputs (FP16 binary) and every output but FP16 as JSON; no ``outputs`` at all gives
    every output as binary data (tritonclient then sends ``binary_data_output``)."""
    inputs = []
    for datatype in TOGETHER:
        tensor = httpclient.InferInput(f"IN_{datatype}", [2, 3], datatype)
        tensor.set_data_from_numpy(sample(datatype), binary_data=datatype in NO_JSON)
        inputs.append(tensor)
    json_types = [t for t in TOGETHER if t not in NO_JSON]
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("all_types", inputs, outputs=[httpclient.InferRequestedOutput(f"OUT_{t}", binary_data=False)
                                                           for t in json_types])
        _check(result, dict.fromkeys(json_types, False))
        _check(client.infer("all_types", inputs), dict.fromkeys(TOGETHER, True))
