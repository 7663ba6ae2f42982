"""Tool-call arguments made only of characters Python strips but JSON does not skip (U+00A0,
U+3000, U+2028, \\x1c): they are no JSON document, not "no arguments". json.loads (how apps read
OpenAI's arguments) and jiter (the anthropic SDK's parser) both refuse them, so the turn is corrupt,
never complete with ``{}``."""

from __future__ import annotations

import json

import orjson
import pytest

from provider_streams import anthropic_tool_use, read_with_anthropic_sdk

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import IncrementalJSON, JSONIncomplete

NOT_JSON_WHITESPACE = ["\u00a0", "\u3000", "\u2028", "\x1c", " \u00a0\n"]


def sse(*events: dict, named: bool = True) -> bytes:
    return b"".join((f"event: {e['type']}\n".encode() if named else b"") + b"data: " + orjson.dumps(e) + b"\n\n"
                    for e in events)


@pytest.mark.parametrize("text", NOT_JSON_WHITESPACE)
def test_incremental_json_refuses_them_as_broken_not_as_no_arguments(text):
    document = IncrementalJSON()
    document.feed(text)
    assert not document.complete()
    with pytest.raises(JSONIncomplete) as failure:
        document.value()
    assert not failure.value.truncated  # no continuation repairs a leading U+00A0


@pytest.mark.parametrize("text", NOT_JSON_WHITESPACE)
def test_an_openai_chat_call_with_them_is_corrupt_as_json_loads_refuses_them(text):
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    body = sse(chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                             "function": {"name": "weather", "arguments": ""}}]}),
               chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}),
               chunk({}, "tool_calls"), named=False) + b"data: [DONE]\n\n"
    with pytest.raises(ValueError):
        json.loads(text)  # what the app does with the arguments
    analysis = analyze_bytes(body, Dialect.OPENAI_CHAT)
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "invalid argument JSON" in analysis.verdict.reason
    call = analysis.turn.tool_calls()[0]
    assert (call.arguments, call.arguments_raw) == (None, text)


@pytest.mark.parametrize("text", NOT_JSON_WHITESPACE)
def test_an_anthropic_tool_use_with_them_is_corrupt_as_the_sdk_refuses_them(text):
    body = anthropic_tool_use(text)
    with pytest.raises(ValueError, match="tool parameter JSON"):
        read_with_anthropic_sdk(body)
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "invalid argument JSON" in verdict.reason, verdict
