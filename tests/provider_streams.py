"""Constructed provider streams (wire-exact, following docs/provider-streams.md shapes) for addon tests.

Each builder returns the body bytes and the facts a test checks the client against.
"""

from __future__ import annotations

import base64
import json

from streamtap.wire import encode_message


def _sse(event: str | None, data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


def openai_chat(text_pieces: list[str], *, finish: str = "stop", done: bool = True, model: str = "gpt-test-1") -> bytes:
    base = {"id": "chatcmpl-T1", "object": "chat.completion.chunk", "created": 1770000000, "model": model}
    out = [_sse(None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
    for piece in text_pieces:
        out.append(_sse(None, {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
    out.append(_sse(None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    out.append(_sse(None, {**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": len(text_pieces), "total_tokens": 9 + len(text_pieces)}}))
    if done:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def openai_responses(text_pieces: list[str], *, model: str = "gpt-test-5") -> bytes:
    text = "".join(text_pieces)
    seq = iter(range(1000))
    resp = {"id": "resp_T1", "object": "response", "created_at": 1770000000, "status": "in_progress", "model": model, "output": [], "usage": None}
    item = {"id": "msg_T1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    out = [
        _sse("response.created", {"type": "response.created", "sequence_number": next(seq), "response": resp}),
        _sse("response.in_progress", {"type": "response.in_progress", "sequence_number": next(seq), "response": resp}),
        _sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": next(seq), "output_index": 0, "item": item}),
        _sse("response.content_part.added", {"type": "response.content_part.added", "sequence_number": next(seq), "item_id": "msg_T1", "output_index": 0, "content_index": 0, "part": part}),
    ]
    for piece in text_pieces:
        out.append(_sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": next(seq), "item_id": "msg_T1", "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []}))
    done_part = {"type": "output_text", "text": text, "annotations": []}
    done_item = {**item, "status": "completed", "content": [done_part]}
    out += [
        _sse("response.output_text.done", {"type": "response.output_text.done", "sequence_number": next(seq), "item_id": "msg_T1", "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
        _sse("response.content_part.done", {"type": "response.content_part.done", "sequence_number": next(seq), "item_id": "msg_T1", "output_index": 0, "content_index": 0, "part": done_part}),
        _sse("response.output_item.done", {"type": "response.output_item.done", "sequence_number": next(seq), "output_index": 0, "item": done_item}),
        _sse("response.completed", {"type": "response.completed", "sequence_number": next(seq), "response": {**resp, "status": "completed", "output": [done_item], "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}}}),
    ]
    return b"".join(out)


def anthropic_events(thinking: str, text: str, tool_args: dict, *, model: str = "claude-test-4") -> list[dict]:
    args = json.dumps(tool_args)
    half = len(args) // 2
    return [
        {"type": "message_start", "message": {"id": "msg_T1", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 40, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": thinking}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_T1", "name": "get_weather", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": args[:half]}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": args[half:]}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 33}},
        {"type": "message_stop"},
    ]


def anthropic(thinking: str, text: str, tool_args: dict, **kwargs) -> bytes:
    return b"".join(_sse(e["type"], e) for e in anthropic_events(thinking, text, tool_args, **kwargs))


def bedrock_invoke(thinking: str, text: str, tool_args: dict) -> bytes:
    out = []
    events = anthropic_events(thinking, text, tool_args)
    events[-1] = {**events[-1], "amazon-bedrock-invocationMetrics": {"inputTokenCount": 40, "outputTokenCount": 33, "invocationLatency": 100, "firstByteLatency": 20}}
    for event in events:
        inner = base64.b64encode(json.dumps(event).encode()).decode()
        payload = json.dumps({"bytes": inner, "p": "abcdefgh"}).encode()
        out.append(encode_message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}, payload))
    return b"".join(out)


def bedrock_converse(text_pieces: list[str], tool_args: dict) -> bytes:
    events = [("messageStart", {"role": "assistant"})]
    for piece in text_pieces:
        events.append(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece}}))
    events.append(("contentBlockStop", {"contentBlockIndex": 0}))
    args = json.dumps(tool_args)
    events += [
        ("contentBlockStart", {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_T1", "name": "get_weather"}}}),
        ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": args[:5]}}}),
        ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": args[5:]}}}),
        ("contentBlockStop", {"contentBlockIndex": 1}),
        ("messageStop", {"stopReason": "tool_use"}),
        ("metadata", {"usage": {"inputTokens": 12, "outputTokens": 20, "totalTokens": 32}, "metrics": {"latencyMs": 80}}),
    ]
    return b"".join(
        encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"}, json.dumps({**payload, "p": "xy"}).encode())
        for kind, payload in events
    )
