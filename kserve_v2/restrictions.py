"""Triton's restricted API groups: ``--grpc-restricted-protocol`` / ``--http-restricted-api``.

Each flag value is ``<group>[,<group>...]:<key>=<value>``: calls in those groups must carry the
header ``key`` (HTTP) or the metadata ``triton-grpc-protocol-<key>`` (gRPC) with exactly ``value``
(Triton's "Limit Endpoint Access" in docs/customization_guide/inference_protocols.md; the group
names are Triton's ``RESTRICTED_CATEGORY_NAMES``). Transport-free: the gRPC interceptor and the
HTTP middleware both read the table this builds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
          "statistics", "trace", "logging")


@dataclass(frozen=True)
class Restriction:
    """The header (lower case) and value a restricted group's calls must carry."""

    header: str
    value: str


def parse_restrictions(specs: Iterable[str]) -> Mapping[str, Restriction]:
    """``["inference,health:key=secret", ...]`` -> {group: Restriction}.

    Raises:
        ValueError: a malformed value, an unknown group (Triton's text "unknown restricted api
            '<name>'"), or a group named in two values.
    """
    table: dict[str, Restriction] = {}
    for spec in specs:
        groups, sep, rule = spec.partition(":")
        key, eq, value = rule.partition("=")
        if not sep or not eq or not groups.strip() or not key.strip():
            raise ValueError(f"restricted api '{spec}' is not <group>[,<group>...]:<key>=<value>")
        for group in (g.strip() for g in groups.split(",")):
            if group not in GROUPS:
                raise ValueError(f"unknown restricted api '{group}' (groups: {', '.join(GROUPS)})")
            if group in table:
                raise ValueError(f"restricted api '{group}' is given more than once")
            table[group] = Restriction(key.strip().lower(), value)
    return table
