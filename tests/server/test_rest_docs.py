"""API discovery: the OpenAPI document is true to the routes, fuzzing it finds no crash, /docs renders."""

from __future__ import annotations

import shutil
import subprocess
import sys

import schemathesis
from hypothesis import HealthCheck, given, settings

from helpers import ROOT, http_json

LIST_ROUTES = """
import re
from prometheus_client import CollectorRegistry
from starlette.routing import Route
from kserve_v2.observability.status import StatusReporter
from transcoding.app import build_app
registry = CollectorRegistry()  # metrics and status on, as the example server runs; unwrap the metrics middleware
async def status():
    return StatusReporter(None, registry, 0).snapshot()
app = build_app(None, 1, registry, status).app
# "{model:path}" is "{model}" in OpenAPI
print(sorted((re.sub(r":\\w+}", "}", r.path), m) for r in app.routes if isinstance(r, Route) for m in r.methods if m != "HEAD"))
"""


def _document(server) -> dict:
    status, document = http_json(server, "/api-doc/openapi.json")
    assert status == 200
    return document


def test_openapi_document_lists_exactly_the_routes(example_server) -> None:
    document = _document(example_server)
    assert document["openapi"].startswith("3.")
    documented = sorted((path, method.upper()) for path, item in document["paths"].items() for method in item)
    routes = subprocess.run([sys.executable, "-c", LIST_ROUTES], cwd=ROOT, capture_output=True, text=True, check=True)
    assert documented == [tuple(r) for r in eval(routes.stdout)]  # noqa: S307 - our own subprocess's repr


def _checker(operation, problems: list[str]):
    """A hypothesis test for one operation: every answer is documented, and none is a 500."""
    documented = operation.definition.raw["responses"]

    @given(operation.as_strategy())
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case) -> None:
        response = case.call()
        if response.status_code == 500:  # 501/503 are documented answers (e.g. load in control mode none)
            problems.append(f"500: {case.method} {case.formatted_path}: {response.text[:200]}")
        elif str(response.status_code) not in documented and response.status_code not in (404, 405):
            problems.append(f"undocumented {response.status_code}: {case.method} {case.formatted_path}: "
                            f"{response.text[:200]}")

    return check


def test_fuzzed_requests_get_documented_answers_and_never_crash(example_server) -> None:
    """schemathesis generates requests for every documented operation from the OpenAPI document."""
    schema = schemathesis.openapi.from_url(f"http://{example_server.http_url}/api-doc/openapi.json")
    problems: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        _checker(result.ok(), problems)()
        operations += 1
    document = _document(example_server)
    # schemathesis leaves out the URL it read the schema from
    assert operations == sum(len(item) for item in document["paths"].values()) - 1
    assert problems == []
    assert http_json(example_server, "/v2/health/live")[0] == 200
    # the fuzzer may have changed the log and trace settings of this shared server: restore them
    for path, body in (("/v2/logging", {"log_info": True, "log_warning": True, "log_error": True,
                                        "log_verbose_level": 0, "log_format": "default"}),
                       ("/v2/trace/setting", {"trace_level": None, "trace_rate": None, "trace_count": None})):
        assert http_json(example_server, path, body)[0] == 200


def test_docs_page_renders_the_api_in_a_real_browser(example_server, tmp_path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is needed: `make test` installs it (Debian package chromium)"
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000"]
    url = f"http://{example_server.http_url}/docs"
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "/v2/models/{model}/infer" in dom and "swagger-ui" in dom, dom[:500]
    shot = tmp_path / "docs.png"
    subprocess.run(flags + ["--window-size=1280,1600", f"--screenshot={shot}", url], capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000, "the page rendered blank"
