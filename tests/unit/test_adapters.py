"""Text adapters' pure steps (adapters/): pooling, SPLADE weights, instruction prefixes, text
inputs, the tokenizer's overflow policies, and token-classification units - on small arrays and a
word-level tokenizer built here (no model file, no server)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from adapters.base import l2_normalize, string_parameter, texts, with_instruction
from adapters.embedding import pool
from adapters.extraction import _units
from adapters.sparse import splade_pool
from adapters.tokenizer import TextTokenizer
from kserve_v2.errors import InputTooLong, InvalidInput

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
