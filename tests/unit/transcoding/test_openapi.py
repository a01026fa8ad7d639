"""The OpenAPI document lists the optional routes only when they are served."""

from __future__ import annotations

import pytest

from transcoding.openapi import openapi_document


@pytest.mark.parametrize(("metrics", "status"), [(False, False), (True, True), (False, True)])
def test_optional_routes_follow_the_flags(metrics: bool, status: bool) -> None:
    paths = openapi_document(metrics=metrics, status=status)["paths"]
    assert ("/metrics" in paths) is metrics
    assert ("/status" in paths) is status
    assert "/v2/systemsharedmemory/status" in paths and "/v2/cudasharedmemory/status" in paths
