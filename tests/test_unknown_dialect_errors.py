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
