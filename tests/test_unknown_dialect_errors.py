"""A body that holds only a provider's error shows no dialect of its own (an overloaded
Anthropic call, a throttled Bedrock one, a failed Ollama one), yet the error shapes every
dialect shares are the provider's own word whatever the dialect: `verify` says errored, with
the error, not that it cannot judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamtap.wire import encode_message

STREAMTAP = Path(sys.executable).with_name("streamtap")

BODIES = {
    "overloaded.sse": (b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n',
                       "overloaded_error: Overloaded"),
    "throttled.bin": (encode_message({":message-type": "exception", ":exception-type": "throttlingException",
                                      ":content-type": "application/json"}, json.dumps({"message": "Too many requests"}).encode()),
                      "throttlingException: Too many requests"),
    "failed.ndjson": (b'{"error":"model \\"llama9\\" not found"}\n', 'model "llama9" not found'),
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_body_of_only_the_provider_s_error_is_errored(tmp_path, name):
    body, said = BODIES[name]
    path = tmp_path / name
    path.write_bytes(body)
    got = subprocess.run([str(STREAMTAP), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 1 and ": errored (unknown, sniffed" in got.stdout and said in got.stdout, got


def test_framing_without_an_error_stays_unknown(tmp_path):
    path = tmp_path / "plain.sse"
    path.write_bytes(b'event: update\ndata: {"progress": 1}\n\n')
    got = subprocess.run([str(STREAMTAP), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert ": unknown (unknown, sniffed" in got.stdout, got


# an HTTP error's body as providers send it: one JSON document, pretty-printed over many lines
OPENAI_ERROR = json.dumps({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                     "param": None, "code": "invalid_api_key"}}, indent=4).encode() + b"\n"
GEMINI_ARRAY_ERROR = b'[{\n  "error": {\n    "code": 429,\n    "message": "Resource exhausted",\n    "status": "RESOURCE_EXHAUSTED"\n  }\n}\n]'


@pytest.mark.parametrize(("name", "body", "said"), [
    ("openai-401.json", OPENAI_ERROR, "invalid_request_error: Incorrect API key provided"),
    ("openai-401.sse", OPENAI_ERROR, "invalid_request_error: Incorrect API key provided"),
    ("openai-401", OPENAI_ERROR, "invalid_request_error: Incorrect API key provided"),
    ("gemini-429.json", GEMINI_ARRAY_ERROR, "Resource exhausted"),
])
def test_a_saved_http_error_body_of_many_lines_is_errored(tmp_path, name, body, said):
    """No stream framing reads a pretty-printed JSON document (the .json reading wanted a '[', the
    NDJSON one a line per value), so the body was called corrupt."""
    path = tmp_path / name
    path.write_bytes(body)
    got = subprocess.run([str(STREAMTAP), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 1 and ": errored (unknown, sniffed: one JSON document holding the provider's error)" in got.stdout, got
    assert said in got.stdout, got
    forced = subprocess.run([str(STREAMTAP), "verify", "--provider", "openai-chat", "--json", str(path)],
                            capture_output=True, text=True, timeout=60)
    judged = json.loads(forced.stdout)
    assert (judged["verdict"]["kind"], judged["dialect"], judged["turn"]["error"]["source"]) == ("errored", "openai-chat", "body"), forced


def test_a_compressed_error_body_and_a_document_without_an_error(tmp_path):
    import zstandard

    compressed = tmp_path / "openai-401.jsonl.zst"
    compressed.write_bytes(zstandard.ZstdCompressor().compress(OPENAI_ERROR))
    got = subprocess.run([str(STREAMTAP), "verify", str(compressed)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 1 and ": errored (unknown" in got.stdout, got
    plain = tmp_path / "answer.json"
    plain.write_bytes(json.dumps({"choices": [{"message": {"content": "hi"}}], "error": None}, indent=2).encode())
    got = subprocess.run([str(STREAMTAP), "verify", str(plain)], capture_output=True, text=True, timeout=60)
    assert "errored" not in got.stdout, got
