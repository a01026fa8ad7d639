"""Shared fixtures: servers on the example repository (module-scoped, started once), and an OTLP/HTTP
collector for the tracing tests.

tritonclient is imported only inside the fixtures that use it, and ``tests/unit`` is not collected
here: the unit layer imports the server's own generated ``inference.*`` modules, which cannot share
a process with tritonclient's (both register the same protobuf symbols). ``pytest tests/unit`` runs
that layer on its own; ``test_unit_layer.py`` runs it in a subprocess as part of the whole suite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from helpers import EXAMPLES, Server, TextModels, build_text_models, start_server

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


@pytest.fixture
def collector() -> Iterator[tuple[str, list[Any]]]:
    """An OTLP/HTTP traces collector on a free port: (its URL, the spans it has received so far)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    spans.extend(scope.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", spans
    server.shutdown()


@pytest.fixture(scope="session")
def text_models(tmp_path_factory: pytest.TempPathFactory) -> TextModels:
    """The text models of `make models`, built once per session (../shared/models, else PyPI)."""
    return build_text_models(tmp_path_factory.mktemp("text-models"))
