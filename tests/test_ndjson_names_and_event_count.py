"""NDJSON by any of its content-type names is tapped by the default filter, and a recording's
end line holds a count of events, never a negative number or text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from streamtap.recording import read_recording
from upstream import Mitmdump, Script, Upstream

REPO = Path(__file__).resolve().parent.parent


def ollama_body() -> bytes:
    lines = [
        {"model": "llama3.2", "created_at": "x", "message": {"role": "assistant", "content": "Hi"}, "done": False},
        {"model": "llama3.2", "created_at": "y", "message": {"role": "assistant", "content": ""}, "done": True,
         "done_reason": "stop", "eval_count": 2},
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.mark.parametrize("content_type", ["application/ndjson", "application/jsonl", "application/x-jsonlines"])
def test_ndjson_by_another_name_is_tapped_and_judged(tmp_path, content_type):
    body = ollama_body()
    with Upstream() as upstream:
        upstream.add("o", Script(body, content_type=content_type, chunk_size=40))
        with Mitmdump(upstream.url, tmp_path) as mitm:
            got = httpx.post(f"{mitm.url}/s/o/api/chat", content=b'{"model":"llama3.2","messages":[]}', timeout=10)
            assert got.content == body
            mitm.wait_log("complete")
            [path] = Path(mitm.record_dir).glob("*.jsonl")
    recording = read_recording(path)
    assert recording.end["verdict"]["kind"] == "complete" and recording.header["dialect"] == "ollama"


@pytest.mark.parametrize("events", [-1, "15", 1.5])
def test_an_end_line_whose_event_count_is_no_count_is_damaged(tmp_path, events):
    lines = (REPO / "recordings" / "openai-chat.jsonl").read_bytes().splitlines(keepends=True)
    end = json.loads(lines[-1])
    end["events"] = events
    path = tmp_path / "forged.jsonl"
    path.write_bytes(b"".join(lines[:-1]) + json.dumps(end).encode() + b"\n")
    got = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "'events'" in got.stdout + got.stderr and "Traceback" not in got.stderr
