"""FlowSpec: what the proxy hands a worker about a flow. The request body crosses as bytes and is
parsed into the recording's header on the far side, into exactly what parsing it at once gives."""

from __future__ import annotations

import gzip
import json
import pickle

import pytest
from mitmproxy.test import tflow

from streamtap.mitm.flowspec import FlowSpec
from streamtap.recording import flow_header

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
def test_the_body_parsed_in_the_worker_gives_the_header_parsed_at_once(name):
    body, encoding = BODIES[name]
    flow = streaming_flow(body, encoding)
    spec = FlowSpec.of(flow, "END")
    assert spec.errors == []
    assert spec.header is not None
    assert not {"body", "body_b64"} & set(spec.header["request"])  # nothing parsed on the proxy
    crossed = pickle.loads(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    detection = spec.detection
    at_once = flow_header(
        flow, started=spec.started, dialect=detection.dialect.value, why=detection.why,
        wire_format=detection.wire, content_encoding=None, sentinel="END",
    )  # fmt: skip
    header = crossed.complete_header()
    assert header == at_once
    assert list(header["request"]) == list(at_once["request"])  # the same field order in the line
    assert crossed.complete_header() == at_once  # completing twice adds nothing
    if name == "json" or name == "gzip json":
        assert header["request"]["body"] == PROMPT
    elif name == "empty":
        assert "body" not in header["request"] and "body_b64" not in header["request"]
    else:
        assert "body_b64" in header["request"]
