"""`streamtap import` undoes a response's Content-Encoding as the live Tap does, stacked codings
(`gzip, br`) included: a capture of such a stream is recorded, not skipped."""

from __future__ import annotations

import gzip
import subprocess
import sys

import brotli
import pytest

from interception import openai_chat_stream
from streamtap.recording import check_recording, read_recording


@pytest.mark.parametrize("encoding", ["gzip", "gzip, br", "identity, gzip"])
def test_a_stream_sent_with_stacked_codings_is_imported_and_judged(tmp_path, encoding):
    from mitmproxy import io
    from mitmproxy.test import tflow

    body = openai_chat_stream(["stacked", " codings"])
    wire = gzip.compress(body)
    if "br" in encoding:
        wire = brotli.compress(wire)
    capture = tmp_path / "capture.mitm"
    with capture.open("wb") as file:
        flow = tflow.tflow(resp=True)
        flow.request.host, flow.request.path = "api.openai.com", "/v1/chat/completions"
        flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
        flow.response.headers["content-type"] = "text/event-stream"
        flow.response.headers["content-encoding"] = encoding
        flow.response.raw_content = wire
        io.FlowWriter(file).add(flow)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "streamtap.cli", "import", str(capture), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [path] = out.glob("*_complete_*.jsonl")
    rec = read_recording(path)
    assert rec.body == body and check_recording(rec) == []
