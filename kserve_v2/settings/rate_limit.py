"""The rate limiter's flags, as Triton's ``tritonserver`` spells them (``--rate-limit``,
``--rate-limit-resource``; Triton's ``docs/user_guide/rate_limiter.md``). The limiter itself is
``kserve_v2.scheduling.rate_limiter``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RateLimitMode = Literal["off", "execution_count"]
RATE_LIMIT_MODES: tuple[RateLimitMode, ...] = ("off", "execution_count")
EVERY_DEVICE = -1  # a resource flag without <device>: the count holds on each device


@dataclass(frozen=True)
class RateLimitResource:
    """One ``--rate-limit-resource <name>:<count>[:<device>]``.

    Attributes:
        name: the resource's name, as instance groups' ``rate_limiter.resources`` name it (case kept,
            as Triton's parser keeps it).
        count: the copies of it available (on ``device``, or on each device; a global resource has
            one set of copies for the whole server).
        device: the GPU id it applies to, or ``EVERY_DEVICE``.
    """

    name: str
    count: int
    device: int = EVERY_DEVICE


def parse_rate_limit_resource(text: str) -> RateLimitResource:
    """Parse ``<name>:<count>`` or ``<name>:<count>:<device>`` (Triton's ``ParseRateLimiterResourceOption``).

    Raises:
        ValueError: another number of fields, an empty name, a count or device that is not an
            integer >= 0 (Triton's "--rate-limit-resource option format is '<resource_name>:<count>:<device>'
            or '<resource_name>:<count>'. Got <text>").
    """
    error = ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
             f"'<resource_name>:<count>'. Got {text}")
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(error)
    try:
        numbers = [int(part) for part in parts[1:]]
    except ValueError:
        raise ValueError(error) from None
    if any(number < 0 for number in numbers):
        raise ValueError(error)
    return RateLimitResource(parts[0], numbers[0], numbers[1] if len(numbers) == 2 else EVERY_DEVICE)
