"""The ``tokenizers`` library around a model's ``tokenizer.json``: batches of int64 arrays.

Truncation is set to the model's ``max_sequence_length`` and padding to the longest item of
each batch, whatever the file says (MiniLM's file pads every item to 128). Overflow policies
follow SIE's ``options.overflow_policy`` (SIE's HTTP API reference): ``default`` and
``truncate_text`` cut the text to fit, ``error`` answers INPUT_TOO_LONG.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from kserve_v2.errors import InputTooLong, InvalidInput

OVERFLOW_POLICIES = ("default", "truncate_text", "error")


@dataclass(slots=True)
class Batch:
    """Tokenized items, padded to the longest.

    Attributes:
        feeds: ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 [items, tokens].
        encodings: one per item, for offsets and special-token masks.
        tokens: real (unpadded) tokens over all items.
    """

    feeds: dict[str, np.ndarray]
    encodings: list[Encoding]
    tokens: int


class TextTokenizer:
    """Thread-safe batch encoder (its settings never change after construction).

    Args:
        path: the ``tokenizer.json`` file.
        max_length: tokens per item, special tokens included.
        model_name: for messages.

    Raises:
        Exception: an unreadable tokenizer file (a load failure).
    """

    def __init__(self, path: Path, max_length: int, model_name: str) -> None:
        self.max_length = max_length
        self._model = model_name
        self._truncating = self._load(path, max_length)
        self._whole = self._load(path, None)

    @staticmethod
    def _load(path: Path, max_length: int | None) -> Tokenizer:
        tokenizer = Tokenizer.from_file(str(path))
        padding = tokenizer.padding or {}
        pad_token = padding.get("pad_token", "[PAD]")
        pad_id = padding.get("pad_id", tokenizer.token_to_id(pad_token) or 0)
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
        if max_length is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(max_length)
        return tokenizer

    def decode_ids(self, items: Sequence[str]) -> list[str]:
        """Items that are JSON arrays of this tokenizer's ids, as text (special tokens dropped); the
        text is tokenized again by ``encode``, a round trip that gives the same ids back for ids this
        tokenizer produced.

        Raises:
            InvalidInput: an item that is not a non-empty array of ids below the vocabulary size -> 400.
        """
        vocabulary = self._whole.get_vocab_size(with_added_tokens=True)
        decoded = []
        for index, item in enumerate(items):
            try:
                ids = json.loads(item)
            except ValueError:
                ids = None
            if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
                raise InvalidInput(f"item {index} is not a JSON array of token ids")
            bad = next((i for i in ids if not 0 <= i < vocabulary), None)
            if bad is not None:
                raise InvalidInput(f"item {index} has token id {bad}, outside the vocabulary of {self._model} "
                                   f"({vocabulary} tokens)")
            decoded.append(self._whole.decode(ids, skip_special_tokens=True))
        return decoded

    def encode(self, items: Sequence[str | tuple[str, str]], policy: str) -> Batch:
        """Tokenize texts, or (query, text) pairs, under an overflow policy.

        Raises:
            InvalidInput: an unknown policy -> INVALID_ARGUMENT / 400.
            InputTooLong: ``error`` policy and an item over ``max_length`` -> INVALID_ARGUMENT /
                400 (SIE's INPUT_TOO_LONG).
        """
        if policy not in OVERFLOW_POLICIES:
            raise InvalidInput(f"unknown overflow_policy '{policy}': use one of {list(OVERFLOW_POLICIES)}")
        if policy == "error":
            encodings = self._whole.encode_batch(list(items))
            for index, encoding in enumerate(encodings):
                observed = sum(encoding.attention_mask)
                if observed > self.max_length:
                    raise InputTooLong(f"Item {index}: observed {observed} tokens exceeds context cap "
                                       f"{self.max_length} for {self._model}")
        else:
            encodings = self._truncating.encode_batch(list(items))
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        return Batch(feeds, encodings, int(feeds["attention_mask"].sum()))
