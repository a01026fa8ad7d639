"""Raw binary requests: the shape Triton's core deduces from the config and the body, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.errors import InvalidInput
from transcoding.v2.raw_binary import NO_ID, raw_binary_request


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


@pytest.mark.parametrize(("config", "body_bytes", "shape"), [
    ('max_batch_size: 8 input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }]', 32, [1, 8]),
    ('max_batch_size: 0 input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }]', 32, [8]),  # no batch dim
    ('max_batch_size: 0 input [{ name: "X" data_type: TYPE_INT16 dims: [3, -1] }]', 24, [3, 4]),
    ('max_batch_size: 4 input [{ name: "X" data_type: TYPE_UINT8 dims: [2, 2] }]', 4, [1, 2, 2]),
])
def test_shape_is_deduced_from_the_config(config: str, body_bytes: int, shape: list[int]) -> None:
    parsed = raw_binary_request(bytes(body_bytes), "m", "", _config(config))
    assert list(parsed.request.inputs[0].shape) == shape and parsed.all_binary
    assert parsed.request.raw_input_contents == [bytes(body_bytes)]


def test_a_one_element_bytes_input_takes_the_whole_body() -> None:
    parsed = raw_binary_request(b"427", "m", "1", _config(
        'max_batch_size: 8 input [{ name: "X" data_type: TYPE_STRING dims: [1] }]'))
    assert (parsed.request.inputs[0].datatype, list(parsed.request.inputs[0].shape)) == ("BYTES", [1, 1])
    assert parsed.request.raw_input_contents == [np.uint32(3).tobytes() + b"427"]


@pytest.mark.parametrize(("config", "text"), [
    ('input [{ name: "X" data_type: TYPE_STRING dims: [-1] }]',
     "For BYTE datatype raw input 'X', the model must have input shape [1]"),
    ('input [{ name: "X" data_type: TYPE_STRING dims: [2] }]',
     "For BYTE datatype raw input 'X', the model must have input shape [1]"),
    ('input [{ name: "X" data_type: TYPE_FP16 dims: [-1, -1] }]',
     "The shape of the raw input 'X' can not be deduced because there are more than one variable-sized dimension"),
    ('input [{ name: "X" data_type: TYPE_FP32 dims: [1] }, { name: "Y" data_type: TYPE_FP32 dims: [1] }]',
     "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration"),
])
def test_what_cannot_be_deduced_gets_tritons_text(config: str, text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        raw_binary_request(b"1234", "m", "", _config(config))
    assert str(err.value) == NO_ID + text
