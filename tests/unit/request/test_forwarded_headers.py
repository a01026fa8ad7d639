"""Triton's --grpc/http-header-forward-pattern (kserve_v2.request.forwarded_headers): headers whose name the pattern
finds (a partial match) become string parameters; the request's own parameters keep their values; binary metadata is
not forwarded; the decoded header is copied, never changed (decoded headers may be shared)."""

from __future__ import annotations

import re

from kserve_v2.codec.messages import InferRequest, RequestHeader, parameter
from kserve_v2.request.forwarded_headers import forwarded


def _request() -> InferRequest:
    return InferRequest(RequestHeader("m", "", {"x-kept": parameter("body")}), "id-1", [b"raw"])


def test_matching_text_headers_become_string_parameters() -> None:
    request = _request()
    headers = [("x-user", "alice"), ("x-kept", "header"), ("other", "no"), ("trace-x-id", "7"), ("x-bin-bin", b"\x00")]
    sent = forwarded(request, headers, re.compile("x-"))
    assert {k: v.value for k, v in sent.parameters.items()} == {"x-user": "alice", "x-kept": "body", "trace-x-id": "7"}
    assert sent.parameters["x-user"].choice == "string_param"
    assert (sent.id, sent.model_name, sent.raw_input_contents) == ("id-1", "m", [b"raw"])
    assert request.parameters == {"x-kept": parameter("body")} and request.header.parameters is request.parameters


def test_no_pattern_or_no_match_keeps_the_request() -> None:
    request = _request()
    assert forwarded(request, [("x-user", "alice")], None) is request
    assert forwarded(request, [("user", "alice")], re.compile("^x-")) is request
