"""Text adapters' pure steps (adapters/): pooling, SPLADE weights, instruction prefixes, text
inputs, the tokenizer's overflow policies, token-classification units and the session options
text backends default to - on small arrays, a word-level tokenizer and an identity graph built
here (no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from tokenizers import Tokenizer, models, pre_tokenizers

from adapters.base import TextAdapter, l2_normalize, string_parameter, texts, with_instruction
from adapters.embedding import pool
from adapters.extraction import _units
from adapters.sparse import splade_pool
from adapters.tokenizer import TextTokenizer
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.errors import InputTooLong, InvalidInput
from kserve_v2.runtime.onnx import open_session
from tests.helpers import identity_model

STATES = np.array([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]],  # third token is padding
                   [[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]]], dtype=np.float32)
MASK = np.array([[1, 1, 0], [1, 0, 0]], dtype=np.int64)


def test_mean_pooling_skips_padding() -> None:
    assert pool(STATES, MASK, "mean", normalize=False).tolist() == [[2.0, 2.0], [0.0, 2.0]]
    unit = pool(STATES, MASK, "mean", normalize=True)
    assert unit.dtype == np.float32 and np.allclose(np.linalg.norm(unit, axis=-1), 1.0)


def test_cls_and_none_pooling() -> None:
    assert pool(STATES, MASK, "cls", normalize=False).tolist() == [[1.0, 0.0], [0.0, 2.0]]
    pooled = np.array([[3.0, 4.0]], dtype=np.float64)
    out = pool(pooled, MASK[:1], "none", normalize=True)
    assert out.dtype == np.float32 and np.allclose(out, [[0.6, 0.8]])


def test_l2_normalize_keeps_zero_rows() -> None:
    assert l2_normalize(np.array([[0.0, 0.0], [0.0, 5.0]], dtype=np.float32)).tolist() == [[0.0, 0.0], [0.0, 1.0]]


def test_splade_pool_is_max_of_log1p_relu_over_real_tokens() -> None:
    logits = np.array([[[-1.0, np.e - 1, 0.0], [0.0, 0.0, 9.0]]], dtype=np.float32)
    weights = splade_pool(logits, np.array([[1, 0]]))  # the second token is padding: its 9.0 is ignored
    assert np.allclose(weights, [[0.0, 1.0, 0.0]])


def test_with_instruction() -> None:
    assert with_instruction("", "text") == "text"
    assert with_instruction("query:", "text") == "query: text"
    assert with_instruction("query:\n", "text") == "query:\ntext"


def test_texts_and_string_parameter() -> None:
    assert texts({"text": np.array([b"caf\xc3\xa9", "x"], dtype=object)}, "text") == ["café", "x"]
    with pytest.raises(InvalidInput, match="no items"):
        texts({"text": np.array([], dtype=object)}, "text")
    with pytest.raises(InvalidInput, match="item 1 of input 'text' is not valid UTF-8"):
        texts({"text": np.array([b"ok", b"\xff"], dtype=object)}, "text")
    assert string_parameter({}, "k", "d") == "d"
    with pytest.raises(InvalidInput, match="parameter 'k' must be a string"):
        string_parameter({"k": 3}, "k", "d")


VOCAB = {"[PAD]": 0, "[UNK]": 1, "alice": 2, "met": 3, "bob": 4, "in": 5, "paris": 6}


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> Path:
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_tokenizer_pads_to_the_longest_and_truncates(tokenizer_file: Path) -> None:
    batch = TextTokenizer(tokenizer_file, 3, "toy").encode(["alice met bob in paris", "bob"], "default")
    assert batch.feeds["input_ids"].tolist() == [[2, 3, 4], [4, 0, 0]]
    assert batch.feeds["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.tokens == 4 and batch.feeds["input_ids"].dtype == np.int64


def test_tokenizer_overflow_policies(tokenizer_file: Path) -> None:
    tokenizer = TextTokenizer(tokenizer_file, 3, "toy")
    with pytest.raises(InputTooLong, match="Item 1: observed 5 tokens exceeds context cap 3 for toy"):
        tokenizer.encode(["bob", "alice met bob in paris"], "error")
    with pytest.raises(InvalidInput, match="unknown overflow_policy 'drop'"):
        tokenizer.encode(["bob"], "drop")
    assert tokenizer.decode_ids(["[2, 3]"]) == ["alice met"]
    with pytest.raises(InvalidInput, match="outside the vocabulary of toy"):
        tokenizer.decode_ids(["[2, 99]"])


def test_extraction_units_per_token(tokenizer_file: Path) -> None:
    encoding = TextTokenizer(tokenizer_file, 8, "toy").encode(["alice met bob"], "default").encodings[0]
    probabilities = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], dtype=np.float32)
    units = _units(encoding, probabilities, "simple")
    assert [(u.label, round(u.score, 2), u.start, u.end) for u in units] == [(1, 0.9, 0, 5), (0, 0.8, 6, 9),
                                                                           (1, 0.7, 10, 13)]
    assert json.dumps([u.word for u in units]) == "[0, 1, 2]"


@pytest.mark.parametrize(("parameters", "spins"), [({}, "1"), ({"allow_spinning": "0"}, "0")])
def test_text_sessions_spin_unless_the_config_says_not(tmp_path: Path, tokenizer_file: Path,
                                                       parameters: dict[str, str], spins: str) -> None:
    """Text backends default ``allow_spinning`` to 1 (their runs are long); the ONNX backend to 0."""
    (tmp_path / "1").mkdir()
    tokenizer_file.rename(tmp_path / "1" / "tokenizer.json")
    onnx.save(identity_model(TensorProto.INT64), str(tmp_path / "1" / "model.onnx"))
    config = mc.ModelConfig(name="toy")
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU)
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    adapter: TextAdapter[Any] = TextAdapter(tmp_path, 1, config)
    options = adapter.session._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == spins
    plain = open_session(tmp_path / "1" / "model.onnx", config)._session.get_session_options()
    assert plain.get_session_config_entry("session.intra_op.allow_spinning") == parameters.get("allow_spinning", "0")
