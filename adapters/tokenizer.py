"""The ``tokenizers`` library around a model's ``tokenizer.json``: batches of int64 arrays.

Truncation is set to the model's ``max_sequence_length`` and padding to the longest item of
each batch, whatever the file says (MiniLM's file pads every item to 128). Overflow policies
follow SIE's ``options.overflow_policy`` (SIE's HTTP API reference): ``default`` and
``truncate_text`` cut the text to fit, ``error`` answers INPUT_TOO_LONG. A cut keeps the start
of the text (``right``, the default) or its end (``left``), as text-embeddings-inference's
``truncation_direction`` and Cohere's ``truncate: START`` do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from kserve_v2.protocol.errors import InputTooLong, InvalidInput

OVERFLOW_POLICIES = ("default", "truncate_text", "error")
DIRECTIONS = ("right", "left")
# one row per token of TextTokenizer.token_rows: id, start and stop (character offsets), special (0/1)
TOKEN_COLUMNS = 4


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
        # one Tokenizer per setting: a Tokenizer's settings are not per call, and these are shared by threads
        self._truncating = {direction: self._load(path, max_length, direction) for direction in DIRECTIONS}
        self._whole = self._load(path, None)

    @staticmethod
    def _load(path: Path, max_length: int | None, direction: str = "right") -> Tokenizer:
        tokenizer = Tokenizer.from_file(str(path))
        padding = tokenizer.padding or {}
        pad_token = padding.get("pad_token", "[PAD]")
        pad_id = padding.get("pad_id", tokenizer.token_to_id(pad_token) or 0)
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
        if max_length is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(max_length, direction=direction)
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

    def encode(self, items: Sequence[str | tuple[str, str]], policy: str, direction: str = "right") -> Batch:
        """Tokenize texts, or (query, text) pairs, under an overflow policy; a cut keeps the start
        of an item (``right``) or its end (``left``).

        Raises:
            InvalidInput: an unknown policy or direction -> INVALID_ARGUMENT / 400.
            InputTooLong: ``error`` policy and an item over ``max_length`` -> INVALID_ARGUMENT /
                400 (SIE's INPUT_TOO_LONG), naming the item's token count and the limit.
        """
        if policy not in OVERFLOW_POLICIES:
            raise InvalidInput(f"unknown overflow_policy '{policy}': use one of {list(OVERFLOW_POLICIES)}")
        if direction not in DIRECTIONS:
            raise InvalidInput(f"unknown truncation_direction '{direction}': use one of {list(DIRECTIONS)}")
        if policy == "error":
            encodings = self._whole.encode_batch(list(items))
            for index, encoding in enumerate(encodings):
                observed = sum(encoding.attention_mask)
                if observed > self.max_length:
                    raise InputTooLong(f"Item {index}: observed {observed} tokens exceeds context cap "
                                       f"{self.max_length} for {self._model}")
        else:
            encodings = self._truncating[direction].encode_batch(list(items))
        return self._batch(encodings)

    def whole(self, items: Sequence[str], add_special_tokens: bool = True) -> Batch:
        """Tokenize texts without any truncation (what ``tokenize`` reports: the real counts)."""
        return self._batch(self._whole.encode_batch(list(items), add_special_tokens=add_special_tokens))

    def cut(self, items: Sequence[str], tokens: int, direction: str = "right") -> list[str]:
        """Each text cut to its first (``right``) or last (``left``) ``tokens`` tokens, special
        tokens not counted (Cohere's ``max_tokens_per_doc``); shorter texts stay as they are.
        The cut falls on a token boundary, so the kept part tokenizes to the same tokens."""
        cut = []
        for text, encoding in zip(items, self._whole.encode_batch(list(items), add_special_tokens=False), strict=True):
            offsets = [offset for offset, real in zip(encoding.offsets, encoding.attention_mask, strict=True) if real]
            if len(offsets) <= tokens:
                cut.append(text)
            elif direction == "left":
                cut.append(text[offsets[-tokens][0]:])
            else:
                cut.append(text[:offsets[tokens - 1][1]])
        return cut

    @staticmethod
    def token_rows(batch: Batch, items: int) -> tuple[np.ndarray, np.ndarray]:
        """Every real token of the batch's first ``items`` items, item after item: (rows int64
        [tokens, 4] of id, start, stop, special; tokens per item int64 [items]). Offsets are
        characters of the item's text (of its own text for a pair's part); a special token has
        special 1 and offsets 0, 0."""
        rows, lengths = [], []
        for encoding in batch.encodings[:items]:
            tokens = [(token, start, stop, special) for token, (start, stop), special, real
                      in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask, encoding.attention_mask,
                             strict=True) if real]
            lengths.append(len(tokens))
            rows.extend(tokens)
        return (np.array(rows, dtype=np.int64).reshape(-1, TOKEN_COLUMNS), np.array(lengths, dtype=np.int64))

    @staticmethod
    def _batch(encodings: list[Encoding]) -> Batch:
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        return Batch(feeds, encodings, int(feeds["attention_mask"].sum()))
