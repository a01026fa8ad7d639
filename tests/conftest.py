"""Shared fixtures: servers on the example repository (module-scoped, started once)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient

from helpers import EXAMPLES, Server, start_server


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server on examples/model_repository, as the README starts it."""
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


@pytest.fixture
def client(example_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    """An unmodified tritonclient.grpc client of the example server."""
    with grpcclient.InferenceServerClient(example_server.url) as triton:
        yield triton
