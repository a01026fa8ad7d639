"""Rerank on a real cross-encoder: /v1/rerank, /v2/rerank and /rerank in Cohere's and Jina's shapes,
the same call as /v1/score, and the unmodified PyPI clients (cohere v1 and v2, LangChain's and
LlamaIndex's Cohere rerankers, LlamaIndex's Jina reranker) pointed at the server.

The cross-encoder is minilm-reranker, which `make models` builds around MiniLM
(examples/build_cross_encoder.py): pairs go in tokenized together, one logit comes out, and its
relevance is sigmoid(10 * cosine - 5) of MiniLM's cosine, so the reference cosines of the MiniLM it
was built from (fp32 with ../shared/models, the PyPI int8 graph without: ``helpers.TextModels``)
give the expected scores exactly.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import RERANKER, SENTENCES, TextModels, http_json, scrape, start_server

MODEL = RERANKER
QUERY, DOCUMENTS = SENTENCES[0], [SENTENCES[2], SENTENCES[1], "The new movie is awful."]
LONG_TEXT = " ".join(["word"] * 600)


def expected(cosine: float) -> float:
    """The cross-encoder's relevance for a MiniLM cosine (build_cross_encoder.py: logit 10 cos - 5, sigmoid)."""
    return 1 / (1 + math.exp(-(10 * cosine - 5)))


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory, text_models: TextModels):
    repository = text_models.link_into(tmp_path_factory.mktemp("rerank-repo"),
                                       (MODEL, "all-MiniLM-L6-v2", "rampart-pii-ner"))
    server = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                          "--load-model", MODEL, "--load-model", "all-MiniLM-L6-v2", "--load-model", "rampart-pii-ner")
    yield server
    assert server.stop() == 0


def post(server, path: str, body: object) -> tuple[int, dict]:
    """(status, JSON reply) of a JSON body POSTed with a bearer token, as the rerank clients send one."""
    return http_json(server, path, body, headers={"Authorization": "Bearer any"}, timeout=120)


def test_the_cross_encoder_scores_pairs_as_its_reference(rerank_server, text_models) -> None:
    """/v1/score and /v1/rerank run the same call: the same scores, the relevant sentence first."""
    bread, cheetah = (expected(c) for c in text_models.reference[MODEL])
    status, body = post(rerank_server, "/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS[:2]})
    assert status == 200 and [r["index"] for r in body["results"]] == [1, 0]
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([bread, cheetah], abs=2e-4)
    assert "document" not in body["results"][0] and body["usage"]["total_tokens"] > 2 * 8  # pairs: query counted twice
    status, score = post(rerank_server, f"/v1/score/{MODEL}", {"query": {"text": QUERY},
                                                               "items": [{"id": "c", "text": DOCUMENTS[0]},
                                                                         {"id": "b", "text": DOCUMENTS[1]}]})
    assert status == 200 and [(s["item_id"], s["score"]) for s in score["scores"]] == [
        ("b", body["results"][0]["relevance_score"]), ("c", body["results"][1]["relevance_score"])]


def test_bodies_of_every_shape_on_every_path(rerank_server) -> None:
    for path, version in (("/v1/rerank", "1"), ("/v2/rerank", "2"), ("/rerank", "1")):
        status, body = post(rerank_server, path, {
            "model": MODEL, "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "top_n": 2,
            "return_documents": True, "max_tokens_per_doc": None, "rank_fields": None})
        assert status == 200, body
        assert [(r["index"], r["document"]["text"]) for r in body["results"]] == [(1, DOCUMENTS[1]), (0, DOCUMENTS[0])]
        assert body["meta"]["api_version"]["version"] == version and body["model"] == MODEL and len(body["id"]) == 36
    for top_n in (0, -1, 10):  # vLLM: non-positive is all; Cohere: more than the documents is all
        assert len(post(rerank_server, "/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS,
                                                   "top_n": top_n})[1]["results"]) == 3


def test_max_tokens_per_doc_scores_the_cut_document(rerank_server) -> None:
    document = "A man is eating a piece of bread in the sunny garden of his house."
    _, cut = post(rerank_server, "/v2/rerank", {"model": MODEL, "query": QUERY, "documents": [document],
                                                "max_tokens_per_doc": 4})
    _, whole = post(rerank_server, "/v2/rerank", {"model": MODEL, "query": QUERY, "documents": [document]})
    _, four = post(rerank_server, "/v2/rerank", {"model": MODEL, "query": QUERY, "documents": ["A man is eating"]})
    assert cut["results"][0]["relevance_score"] == pytest.approx(four["results"][0]["relevance_score"], abs=1e-6)
    assert cut["results"][0]["relevance_score"] != pytest.approx(whole["results"][0]["relevance_score"], abs=1e-3)


def test_truncate_and_instruction(rerank_server) -> None:
    status, body = post(rerank_server, "/v1/rerank", {"model": MODEL, "query": QUERY, "documents": ["bread", LONG_TEXT],
                                                      "truncate": "NONE"})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == f"Item 1: observed 609 tokens exceeds context cap 512 for {MODEL}"
    ends = {}
    for truncate in ("END", "START", None):
        document = "bread " + LONG_TEXT + " cheetah"
        status, body = post(rerank_server, "/v1/rerank", {"model": MODEL, "query": "cheetah", "documents": [document],
                                                          **({"truncate": truncate} if truncate else {})})
        assert status == 200
        ends[truncate] = body["results"][0]["relevance_score"]
    assert ends[None] == ends["END"] != ends["START"]  # Cohere's default is END; START keeps the document's end
    _, plain = post(rerank_server, "/v1/rerank", {"model": MODEL, "query": "eating food", "documents": DOCUMENTS})
    _, instructed = post(rerank_server, "/v1/rerank", {"model": MODEL, "query": "food", "documents": DOCUMENTS,
                                                       "instruction": "eating"})
    assert instructed["results"] == plain["results"]  # the instruction prefixes the query: "eating food"


@pytest.mark.parametrize(("body", "status", "code", "text"), [
    ({"model": "no-such-model", "query": "q", "documents": ["a"]}, 404, "model_not_found", "Model 'no-such-model' not found"),
    ({"model": MODEL, "query": "q", "documents": []}, 400, None, "invalid request at 'documents'"),
    ({"model": MODEL, "query": "q", "documents": [{"image": "https://example.com/a.png"}]}, 400, None,
     "invalid request at 'documents/0'"),
    ({"model": MODEL, "documents": ["a"]}, 400, None, "'query' is a required property"),
    ({"model": MODEL, "query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, 400, None, "max_tokens_per_doc"),
    ({"model": MODEL, "query": "q", "documents": ["a"], "truncate": "MIDDLE"}, 400, None, "invalid request at 'truncate'"),
    ({"model": "rampart-pii-ner", "query": "q", "documents": ["a"]}, 400, None, "does not support 'score'"),
    ({"query": "q", "documents": ["a"]}, 400, None, "name the model: 2 loaded models give scores (all-MiniLM-L6-v2, "),
])
def test_bad_bodies_get_openai_errors(rerank_server, body, status, code, text) -> None:
    got_status, got = post(rerank_server, "/v1/rerank", body)
    assert got_status == status and got["error"]["code"] == code and text in got["error"]["message"], got
    assert got["detail"] == got["error"]["message"]  # Jina's error body, which its clients raise


def test_the_model_may_be_left_out_when_one_loaded_model_scores(rerank_server) -> None:
    def control(action: str) -> None:
        assert http_json(rerank_server, f"/v2/repository/models/all-MiniLM-L6-v2/{action}", {}, timeout=120)[0] == 200

    control("unload")
    try:
        status, body = post(rerank_server, "/rerank", {"query": QUERY, "documents": DOCUMENTS})
        assert status == 200 and body["model"] == MODEL and body["results"][0]["index"] == 1
    finally:
        control("load")


def test_an_over_long_document_fails_alone_when_requests_are_batched(rerank_server, text_models) -> None:
    """Concurrent requests merge into one batch; the one with a document over the limit (its pair
    counted) is refused, the others are scored."""
    bodies = [{"model": MODEL, "query": QUERY, "documents": [LONG_TEXT if i == 3 else DOCUMENTS[i % 3]],
               "truncate": "NONE"} for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda body: post(rerank_server, "/v1/rerank", body), bodies))
    assert [status for status, _ in answers] == [400 if i == 3 else 200 for i in range(8)]
    assert answers[1][1]["results"][0]["relevance_score"] == pytest.approx(expected(text_models.reference[MODEL][0]),
                                                                           abs=2e-4)


def test_cohere_clients_unmodified(rerank_server, text_models) -> None:
    import cohere

    base = f"http://{rerank_server.http_url}"
    v1 = cohere.Client(api_key="unused", base_url=base).rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=2,
                                                               return_documents=True)
    assert [(r.index, r.document.text) for r in v1.results] == [(1, DOCUMENTS[1]), (0, DOCUMENTS[0])]
    assert v1.results[0].relevance_score == pytest.approx(expected(text_models.reference[MODEL][0]), abs=2e-4)
    v2 = cohere.ClientV2(api_key="unused", base_url=base).rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.index for r in v2.results] == [1, 0] and v2.meta.api_version.version == "2"
    with pytest.raises(cohere.errors.NotFoundError):
        cohere.ClientV2(api_key="unused", base_url=base).rerank(model="no-such-model", query=QUERY, documents=DOCUMENTS)


def test_langchain_and_llamaindex_rerankers_unmodified(rerank_server, text_models) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank as LlamaCohereRerank
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    base = f"http://{rerank_server.http_url}"
    best = expected(text_models.reference[MODEL][0])
    kept = CohereRerank(model=MODEL, cohere_api_key="unused", base_url=base, top_n=2).compress_documents(
        [Document(page_content=d) for d in DOCUMENTS], QUERY)
    assert [d.page_content for d in kept] == [DOCUMENTS[1], DOCUMENTS[0]]
    assert kept[0].metadata["relevance_score"] == pytest.approx(best, abs=2e-4)
    nodes = [NodeWithScore(node=TextNode(text=d)) for d in DOCUMENTS]
    for reranker in (LlamaCohereRerank(model=MODEL, api_key="unused", base_url=base, top_n=2),
                     JinaRerank(model=MODEL, api_key="unused", base_url=base + "/v1", top_n=2)):
        ranked = reranker.postprocess_nodes(nodes, QueryBundle(QUERY))
        assert [n.node.get_content() for n in ranked] == [DOCUMENTS[1], DOCUMENTS[0]], type(reranker).__name__
        assert ranked[0].score == pytest.approx(best, abs=2e-4)
    # Jina's client raises the body's ``detail`` when there are no results
    with pytest.raises(RuntimeError, match="Model 'no-such-model' not found"):
        JinaRerank(model="no-such-model", api_key="unused", base_url=base + "/v1").postprocess_nodes(nodes, QueryBundle(QUERY))


def test_rerank_requests_are_counted_under_their_endpoint(rerank_server) -> None:
    def ok_count() -> float:
        labels = (("endpoint", "rerank"), ("model", MODEL), ("status", "ok"))
        return scrape(rerank_server.http_port).get(("sie_requests_total", labels), 0.0)

    before = ok_count()
    assert post(rerank_server, "/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS})[0] == 200
    assert ok_count() == before + 1


def test_the_cross_encoder_as_listed(rerank_server) -> None:
    """ModelInfo lists SIE's output types (not the tokens output every text model has); the
    activation read from config.json shows in the model's configuration."""
    status, info = http_json(rerank_server, f"/v1/models/{MODEL}")
    assert status == 200
    assert (info["outputs"], info["max_sequence_length"], info["loaded"]) == (["score"], 512, True)
    status, config = http_json(rerank_server, f"/v2/models/{MODEL}/config")
    assert status == 200
    assert config["parameters"]["activation"]["string_value"] == "sigmoid"
