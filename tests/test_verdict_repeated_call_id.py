"""Two tool calls of one answer under one id: a provider gives every call its own id, which the
app's answer to it names, so the same id twice is one call sent twice or another answer's calls
stitched on. Corrupt in every dialect that streams ids (Responses had its own rule already)."""

from __future__ import annotations

import json

import orjson
import pytest
from provider_streams import frame_gemini_sse

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import encode_message


def chat(first_id: str, second_id: str) -> bytes:
    def chunk(choice: dict) -> bytes:
        head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    def call(index: int, call_id: str) -> dict:
        return {"index": index, "id": call_id, "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}

    return (chunk({"index": 0, "delta": {"role": "assistant", "tool_calls": [call(0, first_id)]}, "finish_reason": None})
            + chunk({"index": 0, "delta": {"tool_calls": [call(1, second_id)]}, "finish_reason": None})
            + chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}) + b"data: [DONE]\n\n")


def anthropic(first_id: str, second_id: str) -> bytes:
    def sse(event: dict) -> bytes:
        return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

    def tool(index: int, call_id: str) -> list[dict]:
        return [{"type": "content_block_start", "index": index,
                 "content_block": {"type": "tool_use", "id": call_id, "name": "f", "input": {}}},
                {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'}},
                {"type": "content_block_stop", "index": index}]

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}
    events = [{"type": "message_start", "message": message}, *tool(0, first_id), *tool(1, second_id),
              {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
              {"type": "message_stop"}]
    return b"".join(map(sse, events))


def converse(first_id: str, second_id: str) -> bytes:
    def frame(kind: str, payload: dict) -> bytes:
        return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                              json.dumps(payload).encode())

    def tool(index: int, call_id: str) -> bytes:
        return (frame("contentBlockStart", {"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": call_id, "name": "f"}}})
                + frame("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": '{"a": 1}'}}})
                + frame("contentBlockStop", {"contentBlockIndex": index}))

    return (frame("messageStart", {"role": "assistant"}) + tool(0, first_id) + tool(1, second_id)
            + frame("messageStop", {"stopReason": "tool_use"})
            + frame("metadata", {"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}, "metrics": {"latencyMs": 5}}))


def gemini(first_id: str, second_id: str) -> bytes:
    def call(call_id: str) -> dict:
        return {"functionCall": {"id": call_id, "name": "f", "args": {"a": 1}}}

    candidate = {"content": {"role": "model", "parts": [call(first_id), call(second_id)]}, "index": 0, "finishReason": "STOP"}
    return frame_gemini_sse([orjson.dumps({"candidates": [candidate], "responseId": "r1"})])


STREAMS = {Dialect.OPENAI_CHAT: chat, Dialect.ANTHROPIC: anthropic, Dialect.BEDROCK_CONVERSE: converse, Dialect.GEMINI: gemini}


@pytest.mark.parametrize("dialect", sorted(STREAMS, key=str), ids=str)
def test_two_calls_under_one_id_are_corrupt(dialect):
    make = STREAMS[dialect]
    distinct = analyze_bytes(make("call_1", "call_2"), dialect)
    assert distinct.verdict.kind is VerdictKind.COMPLETE, distinct.verdict
    assert [call.id for call in distinct.turn.tool_calls()] == ["call_1", "call_2"]
    for chunk_size in (None, 1):
        verdict = analyze_bytes(make("call_1", "call_1"), dialect, chunk_size=chunk_size).verdict
        assert verdict.kind is VerdictKind.CORRUPT, verdict
        assert "tool calls 0 and 1 of choice 0 carry one id, call_1" in verdict.reason, verdict
        assert verdict.evidence["call_id"] == "call_1" and verdict.evidence["blocks"] == [0, 1]
