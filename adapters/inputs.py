"""Reading a text model's request: BYTES inputs as text, string, integer and boolean parameters, SIE's instruction prefix."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kserve_v2.backend import Parameter
from kserve_v2.protocol.errors import InvalidInput


def texts(feeds: Mapping[str, np.ndarray], name: str) -> list[str]:
    """A BYTES input as text.

    Raises:
        InvalidInput: no items, or an item that is not UTF-8 -> INVALID_ARGUMENT / 400.
    """
    items = feeds[name].reshape(-1)
    if not len(items):
        raise InvalidInput(f"input '{name}' has no items: send at least one text")
    out = []
    for index, item in enumerate(items):
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError:
            raise InvalidInput(f"item {index} of input '{name}' is not valid UTF-8 text") from None
    return out


def string_parameter(parameters: Mapping[str, Parameter], key: str, default: str) -> str:
    """A string request parameter.

    Raises:
        InvalidInput: present with another type -> INVALID_ARGUMENT / 400.
    """
    value = parameters.get(key, default)
    if not isinstance(value, str):
        raise InvalidInput(f"parameter '{key}' must be a string")
    return value


def with_instruction(instruction: str, text: str) -> str:
    """SIE's instruction prefix: ``instruction``, a space unless it ends in whitespace, then the text."""
    if not instruction:
        return text
    return instruction + text if instruction[-1].isspace() else f"{instruction} {text}"


def int_parameter(parameters: Mapping[str, Parameter], key: str) -> int | None:
    """A positive integer request parameter (an int64 parameter, or a string of digits), None when absent.

    Raises:
        InvalidInput: present but not a positive integer -> INVALID_ARGUMENT / 400.
    """
    value = parameters.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"parameter '{key}' must be a positive integer, got {value!r}")
    return value


def flag_parameter(parameters: Mapping[str, Parameter], key: str, default: bool) -> bool:
    """A boolean request parameter: a bool parameter, or the string ``true`` or ``false``.

    Raises:
        InvalidInput: anything else -> INVALID_ARGUMENT / 400.
    """
    value = parameters.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise InvalidInput(f"parameter '{key}' must be true or false, got {value!r}")
    return value
