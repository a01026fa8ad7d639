"""Shared fixtures: servers on the example repository (module-scoped, started once).

tritonclient is imported only inside the fixtures that use it, and ``tests/unit`` is not collected
here: the unit layer imports the server's own generated ``inference.*`` modules, which cannot share
a process with tritonclient's (both register the same protobuf symbols). ``pytest tests/unit`` runs
that layer on its own; ``test_unit_layer.py`` runs it in a subprocess as part of the whole suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from helpers import EXAMPLES, Server, start_server

if TYPE_CHECKING:
    import tritonclient.grpc as grpcclient

collect_ignore = ["unit"]


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server on examples/model_repository, as the README starts it."""
    server = start_server(EXAMPLES, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


@pytest.fixture
def client(example_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    """An unmodified tritonclient.grpc client of the example server."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(example_server.url) as triton:
        yield triton
