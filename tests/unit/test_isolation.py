"""The unit layer's own rule: it runs without tritonclient, whose generated modules clash with ours."""

from __future__ import annotations

import sys

from kserve_v2._proto import grpc_service_pb2


def test_tritonclient_is_not_imported() -> None:
    assert grpc_service_pb2.DESCRIPTOR.package == "inference"
    assert not [name for name in sys.modules if name.split(".")[0] == "tritonclient"]
