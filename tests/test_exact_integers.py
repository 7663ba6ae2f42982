"""Integers past 64 bits in tool arguments: the SDKs' json module reads them exactly, orjson as
doubles. The turn must hold what the app gets, and a recording must write it back exactly."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import orjson
import pytest

from provider_streams import anthropic_events, bedrock_converse, bedrock_invoke
from test_deep_arguments import responses_body
from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.providers.common import dumps
from streamtap.wire.eventstream import encode_message
from streamtap.wire.partial_json import IncrementalJSON, lenient_loads

# past 2**64 and below -2**63, where orjson gives doubles; one at 2**64 - 1, which it reads exactly;
# a long fraction and a string of digits, which both read the same
ARGS_TEXT = ('{"big": 123456789012345678901234567890, "low": -9223372036854775809, "top": 18446744073709551615, '
             '"fraction": 0.12345678901234567890123, "digits": "12345678901234567890123", "nested": [{"id": 99999999999999999999999}]}')
ARGS = json.loads(ARGS_TEXT)


def same(value, expected) -> bool:
    """Equal, and every number of the same type (1e29 == 10**29 is False, but 2.0 == 2 is True)."""
    if type(value) is not type(expected):
        return False
    if isinstance(expected, dict):
        return value.keys() == expected.keys() and all(same(value[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return len(value) == len(expected) and all(map(same, value, expected))
    return value == expected


def test_orjson_alone_reads_these_integers_inexactly():
    """What this file is about: without the exact read, the arguments would differ."""
    assert not same(orjson.loads(ARGS_TEXT), ARGS)


def sse(event: str | None, payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


def chat_body() -> bytes:
    base = {"id": "chatcmpl-B1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-test-1"}
    call = {"index": 0, "id": "call_B1", "type": "function", "function": {"name": "f", "arguments": ""}}
    deltas = [{"role": "assistant", "tool_calls": [call]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ARGS_TEXT[:40]}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ARGS_TEXT[40:]}}]}]
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return b"".join(sse(None, chunk) for chunk in chunks) + sse(None, "[DONE]")


def anthropic_whole_input_events() -> list[dict]:
    """A tool_use block whose input comes whole in its start (as server tools' blocks do), no deltas."""
    events = anthropic_events("t", "x", {})
    start = next(e for e in events if e.get("content_block", {}).get("type") == "tool_use")
    start["content_block"]["input"] = "ARGS"
    return [e for e in events if not (e.get("delta", {}).get("type") == "input_json_delta")]


def whole_input(payload: dict) -> str:
    return json.dumps(payload).replace('"ARGS"', ARGS_TEXT)


def anthropic_whole_input_body() -> bytes:
    return b"".join(sse(e["type"], whole_input(e)) for e in anthropic_whole_input_events())


def bedrock_invoke_whole_input_body() -> bytes:
    out = []
    for event in anthropic_whole_input_events():
        inner = base64.b64encode(whole_input(event).encode()).decode()
        headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
        out.append(encode_message(headers, json.dumps({"bytes": inner}).encode()))
    return b"".join(out)


def gemini_chunks() -> list[str]:
    call = {"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "f", "args": "ARGS"}}]}, "index": 0}],
            "responseId": "R1", "modelVersion": "gemini-test"}
    end = {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "index": 0, "finishReason": "STOP"}],
           "responseId": "R1", "modelVersion": "gemini-test"}
    return [whole_input(call), json.dumps(end)]


def ollama_body() -> bytes:
    call = {"model": "m", "created_at": "2026-01-01T00:00:00.123456789Z",
            "message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "ARGS"}}]}, "done": False}
    end = {"model": "m", "created_at": "2026-01-01T00:00:01.123456789Z", "message": {"role": "assistant", "content": ""},
           "done": True, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 5}
    return (whole_input(call) + "\n" + json.dumps(end) + "\n").encode()


BODIES = {
    "openai-chat": (chat_body, Dialect.OPENAI_CHAT, None),
    "openai-responses": (lambda: responses_body(ARGS), Dialect.OPENAI_RESPONSES, None),
    "anthropic-deltas": (lambda: b"".join(sse(e["type"], e) for e in anthropic_events("t", "x", ARGS)), Dialect.ANTHROPIC, None),
    "anthropic-whole": (anthropic_whole_input_body, Dialect.ANTHROPIC, None),
    "bedrock-invoke-deltas": (lambda: bedrock_invoke("t", "x", ARGS), Dialect.BEDROCK_INVOKE, None),
    "bedrock-invoke-whole": (bedrock_invoke_whole_input_body, Dialect.BEDROCK_INVOKE, None),
    "bedrock-converse": (lambda: bedrock_converse(["x"], ARGS), Dialect.BEDROCK_CONVERSE, None),
    "gemini-sse": (lambda: "".join(f"data: {c}\r\n\r\n" for c in gemini_chunks()).encode(), Dialect.GEMINI, "sse"),
    "gemini-array": (lambda: ("[" + ",\n".join(gemini_chunks()) + "]").encode(), Dialect.GEMINI, "json-array"),
    "ollama": (ollama_body, Dialect.OLLAMA, None),
}


def tool_call(analysis):
    [call] = [block for choice in analysis.turn.choices for block in choice.blocks if block.kind == "tool_call"]
    return call


@pytest.mark.parametrize("name", BODIES)
@pytest.mark.parametrize("chunk_size", [None, 1, 13])
def test_tool_arguments_hold_the_integers_the_sdks_read(name, chunk_size):
    make, dialect, wire = BODIES[name]
    body = make()
    analysis = analyze_bytes(body, dialect, chunk_size=chunk_size, **({"wire": wire} if wire else {}))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, (analysis.verdict.reason, analysis.findings)
    call = tool_call(analysis)
    assert same(call.arguments, ARGS), call.arguments
    if not name.endswith("-whole"):  # else the text is the deltas', and there are none
        assert same(json.loads(call.arguments_raw), ARGS)


def test_lenient_reading_keeps_integers_exact_where_orjson_refuses_the_text():
    """``1e400`` sends the text to the json module, which reads the integer exactly as well."""
    value = lenient_loads('{"inf": 1e400, "big": 123456789012345678901234567890}')
    assert value["inf"] == float("inf") and same(value["big"], 123456789012345678901234567890)
    fragments = IncrementalJSON()
    fragments.feed('{"big": 1234567890')
    fragments.feed('1234567890123456789}')
    assert same(fragments.value(), {"big": 12345678901234567890123456789})


def test_lenient_reading_still_refuses_a_lone_surrogate():
    """The NDJSON wire's reading (OpenAI's tool arguments hold U+FFFD for one: ``judge.parse_arguments``)."""
    with pytest.raises(orjson.JSONDecodeError):
        lenient_loads('{"s": "\\ud800", "inf": 1e400}')


def test_dumps_writes_long_integers_in_orjsons_format():
    assert dumps(ARGS) == json.dumps(ARGS, ensure_ascii=False, separators=(",", ":"))
    assert dumps({"x": [1, "é"]}) == orjson.dumps({"x": [1, "é"]}).decode()


@pytest.mark.parametrize("verb", [["show", "--json"], ["verify", "--json"]])
def test_json_output_of_a_body_holds_the_exact_integers(tmp_path, verb):
    path = tmp_path / "big.sse"
    path.write_bytes(chat_body())
    result = subprocess.run([sys.executable, "-m", "streamtap", *verb, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    judged = json.loads(result.stdout)  # the json module: orjson would read the integers as doubles again
    [call] = [b for choice in judged["turn"]["choices"] for b in choice["blocks"] if b["kind"] == "tool_call"]
    assert same(call["arguments"], ARGS)
