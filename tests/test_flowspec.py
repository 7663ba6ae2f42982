"""FlowSpec: what the proxy hands a worker about a flow. The proxy parses no JSON: the request
body crosses as bytes, and the far side's detection and header are exactly what detecting and
parsing at once on the proxy gave."""

from __future__ import annotations

import gzip
import json
import pickle
from dataclasses import replace

import pytest
from mitmproxy.test import tflow

from streamtap.mitm.flowspec import FlowSpec
from streamtap.providers import detect_dialect
from streamtap.recording import flow_header
from streamtap.recording.content import decoded_body
from streamtap.recording.flows import request_info

PROMPT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "é " * 50_000}]}


def streaming_flow(body: bytes, encoding: str | None = None):
    f = tflow.tflow(resp=True)
    f.request.method, f.request.path = "POST", "/v1/chat/completions"
    f.request.headers["content-type"] = "application/json"
    if encoding:
        f.request.headers["content-encoding"] = encoding
    f.request.raw_content = body
    f.response.headers["content-type"] = "text/event-stream"
    f.response.content = None
    return f


BODIES = {
    "json": (json.dumps(PROMPT).encode(), None),
    "gzip json": (gzip.compress(json.dumps(PROMPT).encode()), "gzip"),
    "not json": (b"\x00\x01 binary, not JSON", None),
    "gzip that is not": (b"not gzip at all", "gzip"),
    "empty": (b"", None),
}


@pytest.mark.parametrize("name", BODIES)
def test_the_worker_completes_the_spec_into_what_the_proxy_would_have_made(name):
    body, encoding = BODIES[name]
    flow = streaming_flow(body, encoding)
    seen = request_info(flow)  # as the server reads it: decoded, where it can be
    at_once = detect_dialect(replace(seen, body=decoded_body(body, encoding) or body), "text/event-stream")
    spec = FlowSpec.of(flow, "END")
    assert spec.errors == []
    assert spec.header is not None
    assert not {"body", "body_b64"} & set(spec.header["request"])  # nothing parsed on the proxy
    assert spec.detection.dialect == at_once.dialect  # what the proxy needs: the provider
    crossed = pickle.loads(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    crossed.complete()
    assert crossed.errors == []
    assert crossed.detection == at_once
    expected = flow_header(
        flow, started=spec.started, dialect=at_once.dialect.value, why=at_once.why,
        wire_format=at_once.wire, content_encoding=None, sentinel="END",
    )  # fmt: skip
    header = crossed.header
    assert header == expected
    assert list(header) == list(expected) and list(header["request"]) == list(expected["request"])  # the line's field order
    crossed.complete()
    assert crossed.header == expected  # completing twice changes nothing
    if name == "json":
        assert header["request"]["body"] == PROMPT
        assert "stream=True" in header["why"]  # the body's stream flag, read on the far side
    elif name == "gzip json":
        assert header["request"]["body"] == PROMPT
        assert "stream=True" in header["why"]  # read decoded, as the server reads it
    elif name == "empty":
        assert "body" not in header["request"] and "body_b64" not in header["request"]
    elif name == "gzip that is not":  # never the bytes as sent, which may be compressed secrets
        assert "body_b64" not in header["request"] and header["request"]["body_omitted"]["bytes"] == len(body)
    else:
        assert "body_b64" in header["request"]


def test_the_request_headers_are_what_mitmproxy_gives_for_each_name():
    """Lower-case names, repeated ones joined by ", " in order, bytes that are not UTF-8 kept
    (surrogates): what ``headers.items()`` gives, read in one pass."""
    flow = tflow.tflow()
    flow.request.headers.fields = (
        (b"Content-Type", b"application/json"),
        (b"X-Trace", b"a"),
        (b"x-trace", b"b"),
        (b"X-TRACE", b"c"),
        (b"Anthropic-Beta", b"tools-2024"),
        (b"X-Raw", b"\xff\xfe"),
    )
    expected = {name.lower(): value for name, value in flow.request.headers.items()}
    assert request_info(flow).headers == expected
    assert expected["x-trace"] == "a, b, c" and list(expected) == ["content-type", "x-trace", "anthropic-beta", "x-raw"]
