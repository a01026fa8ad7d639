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


def parse_restrictions(specs: Iterable[str], flag: str = "http-restricted-api") -> Mapping[str, Restriction]:
    """``["inference,health:key=secret", ...]`` -> {group: Restriction}.

    ``flag``: ``http-restricted-api`` or ``grpc-restricted-protocol``, for the texts (Triton calls the
    groups of the one "api" and of the other "protocol").

    Raises:
        ValueError: Triton's texts (``command_line_parser.cc``): a malformed value ("--<flag> option
            format is '<config name>:<setting>=<value>'. Got <value>"), an unknown group ("unknown
            restricted api '<name>'"), or a group named twice ("restricted api '<name>' can not be
            specified in multiple config groups").
    """
    feature = "protocol" if flag.startswith("grpc") else "api"
    table: dict[str, Restriction] = {}
    for spec in specs:
        groups, sep, rule = spec.partition(":")
        key, eq, value = rule.partition("=")
        if not sep or not eq or not groups or not key or not value:
            raise ValueError(f"--{flag} option format is '<config name>:<setting>=<value>'. Got {spec}")
        for group in groups.split(","):
            if group not in GROUPS:
                raise ValueError(f"unknown restricted {feature} '{group}'")
            if group in table:
                raise ValueError(f"restricted {feature} '{group}' can not be specified in multiple config groups")
            table[group] = Restriction(key.lower(), value)
    return table
