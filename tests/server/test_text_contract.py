"""A new text model is one class: a cross-encoder variant, installed as a plugin backend (an entry
point in a dist-info folder on PYTHONPATH, as ``pip install`` would leave it), is served by the
unchanged semantic routes, which learn everything from its contract - even its V2 output's name."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper
from tokenizers import Tokenizer, models, pre_tokenizers

from helpers import add_model, http_json, identity_model, make_model, start_server

VOCAB = {"[PAD]": 0, "[UNK]": 1, "paris": 2, "is": 3, "big": 4, "a": 5, "small": 6, "town": 7, "which": 8, "city": 9}
WEIGHTS = np.random.default_rng(11).normal(size=len(VOCAB)).astype(np.float32)
PLUGIN = '''"""A cross-encoder whose score is tanh of the pair's logit, under its own V2 output name."""
import numpy as np

from adapters.base import Prepared, TextAdapter
from adapters.inputs import texts
from kserve_v2.backend import Backend
from kserve_v2.backend.text import InputKind, OutputKind, TextInput, TextOutput


class TanhPairScorer(TextAdapter[Prepared]):
    def __init__(self, model_dir, version, config):
        super().__init__(model_dir, version, config)
        self.declare((TextInput(InputKind.QUERY), TextInput(InputKind.TEXT)),
                     (TextOutput(OutputKind.SCORE, "float32", 0, "relevance"),))

    def preprocess(self, feeds, parameters):
        query, items = texts(feeds, "query")[0], texts(feeds, "text")
        return Prepared(self.encode([(query, text) for text in items], parameters), items)

    def postprocess(self, prepared, graph, wanted):
        return {"relevance": np.tanh(graph[0].reshape(-1)).astype(np.float32)}


BACKEND = Backend(TanhPairScorer, offers=(OutputKind.SCORE,))
'''


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory: pytest.TempPathFactory):
    plugin = tmp_path_factory.mktemp("plugin")
    (plugin / "tanh_pair_scorer.py").write_text(PLUGIN)
    info = plugin / "tanh_pair_scorer-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tanh-pair-scorer\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kserve_v2.backends]\ntext_tanh_pair = tanh_pair_scorer:BACKEND\n")
    repository = tmp_path_factory.mktemp("repo")
    nodes = [helper.make_node("Gather", ["W", "input_ids"], ["g"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["g", "m"], ["gm"]),
             helper.make_node("ReduceSum", ["gm", "axis"], ["logits"], keepdims=0)]
    model = make_model(nodes, [("input_ids", TensorProto.INT64, [None, None]),
                               ("attention_mask", TensorProto.INT64, [None, None])], [("logits", TensorProto.FLOAT, [None])])
    model.graph.initializer.extend([helper.make_tensor("W", TensorProto.FLOAT, [len(VOCAB)], WEIGHTS.tolist()),
                                    helper.make_tensor("axis", TensorProto.INT64, [1], [1])])
    folder = add_model(repository, "pair-scorer", model, 'backend: "text_tanh_pair"\ndynamic_batching { }\n'
                       'parameters { key: "max_sequence_length" value { string_value: "16" } }')
    _tokenizer().save(str(folder / "1" / "tokenizer.json"))
    add_model(repository, "ident", identity_model(TensorProto.FLOAT))  # a tensor model: no contract
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin), os.environ.get("PYTHONPATH")])))
        server = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                              "--load-model", "*")
    yield server
    assert server.stop() == 0


def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def test_a_plugin_cross_encoder_is_served_by_the_unchanged_score_route(plugin_server) -> None:
    query, items = "which city", ["paris is big", "a small town", "town"]
    status, body = http_json(plugin_server, "/v1/score/pair-scorer",
                        {"query": {"text": query}, "items": [{"id": str(i), "text": t} for i, t in enumerate(items)]})
    expected = [np.tanh(WEIGHTS[_tokenizer().encode(query, text).ids].sum()) for text in items]
    assert status == 200 and body["model"] == "pair-scorer"
    scores = {int(s["item_id"]): s["score"] for s in body["scores"]}
    np.testing.assert_allclose([scores[i] for i in range(3)], expected, rtol=1e-5)
    assert [int(s["item_id"]) for s in body["scores"]] == sorted(range(3), key=lambda i: -expected[i])


def test_its_contract_is_its_v2_interface_and_its_model_info(plugin_server) -> None:
    status, metadata = http_json(plugin_server, "/v2/models/pair-scorer")
    assert status == 200 and metadata["platform"] == "text_tanh_pair"
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [("query", "BYTES", [1]),
                                                                                    ("text", "BYTES", [-1])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == [  # tokens: every text model's
        ("relevance", "FP32", [-1]), ("tokens", "INT64", [-1, 4]), ("token_lengths", "INT64", [-1])]
    status, listing = http_json(plugin_server, "/v1/models")
    info = {m["name"]: m for m in listing["models"]}["pair-scorer"]
    assert (info["outputs"], info["dims"], info["loaded"], info["max_sequence_length"]) == (["score"], {}, True, 16)
    status, body = http_json(plugin_server, "/v1/encode/pair-scorer", {"items": [{"text": "paris"}]})
    assert status == 400 and body["detail"]["message"] == (
        "model 'pair-scorer' does not produce 'dense' outputs (it produces: score)")


def test_a_model_that_is_not_loaded_lists_what_its_backend_offers(plugin_server) -> None:
    assert http_json(plugin_server, "/v2/repository/models/pair-scorer/unload", {})[0] == 200
    try:
        info = {m["name"]: m for m in http_json(plugin_server, "/v1/models")[1]["models"]}["pair-scorer"]
        assert (info["outputs"], info["loaded"]) == (["score"], False)
        status, body = http_json(plugin_server, "/v1/score/pair-scorer", {"query": {"text": "q"}, "items": [{"text": "x"}]})
        assert (status, body["detail"]["code"], body["detail"]["model"]) == (503, "MODEL_NOT_LOADED", "pair-scorer")
    finally:
        assert http_json(plugin_server, "/v2/repository/models/pair-scorer/load", {})[0] == 200


def test_a_tensor_model_has_no_text_contract(plugin_server) -> None:
    status, listing = http_json(plugin_server, "/v1/models")
    assert status == 200 and [m["name"] for m in listing["models"]] == ["pair-scorer"]
    status, body = http_json(plugin_server, "/v1/models/ident")
    assert (status, body["error"]["message"]) == (404, "Model 'ident' is not a text model (it has no BYTES 'text' input)")
    status, body = http_json(plugin_server, "/v1/score/ident", {"query": {"text": "q"}, "items": [{"text": "x"}]})
    assert (status, body["detail"]["message"]) == (400, "model 'ident' does not support 'score' (it supports: none)")
