"""Tool-call arguments nested past Python's recursion limit (orjson reads 1024 levels, and the
NDJSON decoder's json-module fallback a little deeper): the turn still becomes a dict, and
`verify --json`, `import`, the proxy's end line and the recordings all hold it and read it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from test_deep_arguments import record_as_the_proxy

PAST_ORJSON = 1020  # an Ollama line, and a recording's end line, deeper than orjson reads


def nested(depth: int) -> dict:
    root: dict = {}
    node = root
    for _ in range(depth - 1):
        node["a"] = {}
        node = node["a"]
    node["leaf"] = "ünïcode"
    return root


def as_json(value: object) -> bytes:
    # the json module: orjson writes 254 levels only
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def ollama_body(args: dict) -> bytes:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "deep", "arguments": args}}]}
    lines = [{"model": "q", "created_at": "t", "message": call, "done": False},
             {"model": "q", "created_at": "t", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop"}]
    return b"".join(as_json(line) + b"\n" for line in lines)


def gemini_body(args: dict) -> bytes:
    candidate = {"content": {"role": "model", "parts": [{"functionCall": {"name": "deep", "args": args}}]},
                 "finishReason": "STOP", "index": 0}
    return b"data: " + as_json({"candidates": [candidate], "responseId": "R1"}) + b"\r\n\r\n"


def tool_calls(turn: dict) -> list[dict]:
    return [block for choice in turn["choices"] for block in choice["blocks"] if block["kind"] == "tool_call"]


def streamtap(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtap", *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("depth", [1000, 1023])
def test_to_dict_converts_arguments_past_the_recursion_limit(depth):
    analysis = analyze_bytes(ollama_body(nested(depth)), Dialect.OLLAMA)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    turn = analysis.turn.to_dict()
    [call] = tool_calls(turn)  # (an enum is given as its value)
    assert call["arguments"] == nested(depth) and call["name"] == "deep"
    assert turn["dialect"] == "ollama" and list(turn)[:3] == ["dialect", "model", "response_id"]  # the fields in order
    assert analysis.verdict.to_dict()["kind"] == "complete"


@pytest.mark.parametrize("dialect, body", [
    (Dialect.OLLAMA, ollama_body(nested(PAST_ORJSON))),
    (Dialect.GEMINI, gemini_body(nested(1000))),
], ids=["ollama", "gemini"])
def test_verify_json_holds_arguments_past_the_recursion_limit(tmp_path, dialect, body):
    """`verify --json` exits 0 for a complete turn (it exited 3, an internal error)."""
    path = tmp_path / ("deep.ndjson" if dialect is Dialect.OLLAMA else "deep.sse")
    path.write_bytes(body)
    result = streamtap("verify", "--json", "--provider", dialect.value, path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-500:]
    judged = json.loads(result.stdout)
    [call] = tool_calls(judged["turn"])
    assert judged["verdict"]["kind"] == "complete" and call["name"] == "deep"


def test_import_records_arguments_past_orjsons_depth_and_the_recording_reads_back(tmp_path):
    """The flow is recorded (it was skipped, exit 1), and its end line, deeper than orjson
    reads, is read back: by `import` run again (is this flow recorded already?), and by `verify`."""
    from mitmproxy import io
    from mitmproxy.test import tflow

    flow = tflow.tflow(resp=True)
    flow.request.scheme, flow.request.host, flow.request.port = "http", "127.0.0.1", 11434
    flow.request.path, flow.request.content = "/api/chat", b'{"model":"q","messages":[{"role":"user","content":"hi"}]}'
    flow.response.headers["content-type"] = "application/x-ndjson"
    flow.response.content = ollama_body(nested(PAST_ORJSON))
    capture = tmp_path / "deep.mitm"
    with capture.open("wb") as file:
        io.FlowWriter(file).add(flow)
    out = tmp_path / "out"
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0 and "1 recorded" in result.stderr, result.stdout + result.stderr[-500:]
    [recording] = out.glob("*.jsonl")
    assert "_ollama_complete_" in recording.name
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0 and "1 already there" in result.stderr, result.stdout + result.stderr[-500:]
    result = streamtap("verify", "--json", recording)
    assert result.returncode == 0, result.stdout + result.stderr[-500:]
    [call] = tool_calls(json.loads(result.stdout)["turn"])
    assert call["arguments"] == nested(PAST_ORJSON)
    # another flow with the same id is told apart by the end line's wire hash: recorded beside it
    flow.response.content = ollama_body({"city": "Tokyo"})
    with capture.open("wb") as file:
        io.FlowWriter(file).add(flow)
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0 and "1 recorded" in result.stderr, result.stdout + result.stderr[-500:]


def test_the_proxys_end_line_holds_arguments_past_orjsons_depth_and_verifies(tmp_path):
    """As the live tap ends a flow: the turn as a dict on the end line, written and read back."""
    path = record_as_the_proxy(tmp_path / "deep.jsonl", ollama_body(nested(PAST_ORJSON)), Dialect.OLLAMA,
                               ("http://127.0.0.1:11434/api/chat", "ndjson", "application/x-ndjson"))
    with pytest.raises(orjson.JSONDecodeError, match="depth"):
        orjson.loads(path.read_bytes().split(b"\n")[-2])  # the end line
    result = streamtap("verify", path)
    assert result.returncode == 0 and ": complete " in result.stdout, result.stdout + result.stderr[-500:]
    result = streamtap("report", tmp_path)  # reads the end lines alone
    assert result.returncode == 0 and "damaged" not in result.stdout, result.stdout + result.stderr[-500:]
