"""Rerank and truncation logic without a server: the cross-encoder's activation as
sentence-transformers reads it, the truncate field's V2 parameters, the tokenizer's cut, left
truncation and token rows, the integer and boolean request parameters - on a word-level
tokenizer built here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from adapters.inputs import flag_parameter, int_parameter
from adapters.rerank import configured_activation, relevance
from adapters.tokenizer import TextTokenizer
from kserve_v2.protocol.errors import InputTooLong, InvalidInput
from transcoding.semantic.text_calls import truncation

VOCAB = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "alice": 4, "met": 5, "bob": 6, "in": 7, "paris": 8}


@pytest.fixture
def tokenizer(tmp_path: Path) -> TextTokenizer:
    """A BERT-like word-level tokenizer ([CLS] a [SEP] b [SEP] for pairs), 5 tokens at most."""
    model = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                         special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    path = tmp_path / "tokenizer.json"
    model.save(str(path))
    return TextTokenizer(path, 5, "toy")


@pytest.mark.parametrize(("config", "expected"), [
    (None, "sigmoid"),  # no config.json: one label, sigmoid
    ({"id2label": {"0": "LABEL_0"}}, "sigmoid"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}, "none"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}, "sigmoid"),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "none"),
])
def test_the_activation_is_read_as_sentence_transformers_reads_it(tmp_path: Path, config: dict | None,
                                                                  expected: str) -> None:
    path = tmp_path / "config.json"
    if config is not None:
        path.write_text(json.dumps(config))
    assert configured_activation(path) == expected


def test_an_unsupported_activation_fails_the_load(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}))
    with pytest.raises(ValueError, match="only Sigmoid and Identity"):
        configured_activation(path)


def test_relevance_of_one_or_two_logits() -> None:
    assert relevance(np.array([[0.0], [2.0]]), "sigmoid") == pytest.approx([0.5, 1 / (1 + np.exp(-2))])
    assert relevance(np.array([0.0, 2.0]), "none").tolist() == [0.0, 2.0]
    assert relevance(np.array([[1.0, 3.0]]), "sigmoid") == pytest.approx([1 / (1 + np.exp(-2))])  # softmax's class 1


@pytest.mark.parametrize(("truncate", "direction", "expected"), [
    (None, None, {}),
    (False, None, {"overflow_policy": "error"}),
    ("NONE", None, {"overflow_policy": "error"}),
    (True, None, {"overflow_policy": "truncate_text", "truncation_direction": "right"}),
    ("END", None, {"overflow_policy": "truncate_text", "truncation_direction": "right"}),
    ("START", None, {"overflow_policy": "truncate_text", "truncation_direction": "left"}),
    (True, "Left", {"overflow_policy": "truncate_text", "truncation_direction": "left"}),
    ("end", "Left", {"overflow_policy": "truncate_text", "truncation_direction": "right"}),
])
def test_truncate_fields_become_v2_parameters(truncate: bool | str | None, direction: str | None,
                                              expected: dict[str, str]) -> None:
    assert truncation(truncate, direction) == expected


def test_truncation_keeps_the_start_or_the_end(tokenizer: TextTokenizer) -> None:
    text = "alice met bob in paris"
    right = tokenizer.encode([text], "truncate_text", "right").feeds["input_ids"].tolist()
    left = tokenizer.encode([text], "truncate_text", "left").feeds["input_ids"].tolist()
    assert right == [[2, 4, 5, 6, 3]] and left == [[2, 6, 7, 8, 3]]
    with pytest.raises(InputTooLong, match="observed 7 tokens exceeds context cap 5 for toy"):
        tokenizer.encode([text], "error", "left")
    with pytest.raises(InvalidInput, match="unknown truncation_direction 'up'"):
        tokenizer.encode([text], "default", "up")


def test_pairs_are_tokenized_together_with_type_ids(tokenizer: TextTokenizer) -> None:
    batch = tokenizer.encode([("bob", "paris")], "error")
    assert batch.feeds["input_ids"].tolist() == [[2, 6, 3, 8, 3]]
    assert batch.feeds["token_type_ids"].tolist() == [[0, 0, 0, 1, 1]]


def test_cut_keeps_whole_tokens_from_either_end(tokenizer: TextTokenizer) -> None:
    assert tokenizer.cut(["alice met  bob in paris", "bob"], 2) == ["alice met", "bob"]
    assert tokenizer.cut(["alice met bob  in paris"], 2, "left") == ["in paris"]


def test_token_rows_give_ids_offsets_and_special_flags_untruncated(tokenizer: TextTokenizer) -> None:
    batch = tokenizer.whole(["alice met bob in paris", "bob"])
    rows, lengths = TextTokenizer.token_rows(batch, 2)
    assert lengths.tolist() == [7, 3] and rows.dtype == np.int64
    assert rows[:3].tolist() == [[2, 0, 0, 1], [4, 0, 5, 0], [5, 6, 9, 0]]
    assert rows[7:].tolist() == [[2, 0, 0, 1], [6, 0, 3, 0], [3, 0, 0, 1]]  # the padding of "bob" is left out
    bare = tokenizer.whole(["bob"], add_special_tokens=False)
    assert TextTokenizer.token_rows(bare, 1)[0].tolist() == [[6, 0, 3, 0]]


def test_integer_and_flag_parameters() -> None:
    assert int_parameter({}, "n") is None
    assert int_parameter({"n": "12"}, "n") == 12 and int_parameter({"n": 3}, "n") == 3
    for bad in ("0", -1, "x", True, 1.5):
        with pytest.raises(InvalidInput, match="parameter 'n' must be a positive integer"):
            int_parameter({"n": bad}, "n")
    assert flag_parameter({}, "f", True) is True
    assert flag_parameter({"f": "False"}, "f", True) is False and flag_parameter({"f": True}, "f", False) is True
    with pytest.raises(InvalidInput, match="parameter 'f' must be true or false"):
        flag_parameter({"f": "maybe"}, "f", True)
