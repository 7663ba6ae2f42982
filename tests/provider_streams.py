"""Provider streams for the tests: constructed ones, and real captures from ../shared/fixtures.

Constructed streams (``openai_chat`` ... ``bedrock_converse``) are wire-exact, following
docs/provider-streams.md shapes; each builder returns the body bytes the tests check a
client against. The capture helpers (``cassette_responses``, ``chunk_lines`` and the
``frame_*`` re-framers, cuts) turn ../shared/ fixtures into the bytes a provider would have
sent; re-framed chunk lists are labelled "constructed" framing around real payloads.
Nothing here decides a verdict.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from conftest import FIXTURES

from streamtap.providers import RequestInfo, VerdictKind
from streamtap.wire import SSEDecoder, Tail, encode_message

# verdict kinds in one letter, for the tables of expected outcomes
C, T, L, F, E, X = (
    VerdictKind.COMPLETE,
    VerdictKind.TRUNCATED,
    VerdictKind.STOPPED_BY_LIMIT,
    VerdictKind.FILTERED,
    VerdictKind.ERRORED,
    VerdictKind.CORRUPT,
)


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


def anthropic_tool_use(partial_json: str, *, name: str = "weather") -> bytes:
    """One tool_use block whose input arrives as one ``input_json_delta`` of ``partial_json``, the
    message stopping to call it."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    events = [{"type": "message_start", "message": message},
              {"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": partial_json}},
              {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
               "usage": {"output_tokens": 5}},
              {"type": "message_stop"}]
    return b"".join(_sse(event["type"], event) for event in events)


def read_with_anthropic_sdk(body: bytes) -> None:
    """The real anthropic SDK's ``messages.stream`` read to its end over ``body`` (it raises what it raises)."""
    import anthropic
    import httpx2  # the anthropic SDK is built on httpx2

    http = httpx2.Client(transport=httpx2.MockTransport(
        lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)))
    client = anthropic.Anthropic(api_key="x", base_url="http://t", max_retries=0, http_client=http)
    with client.messages.stream(model="claude", max_tokens=10, messages=[{"role": "user", "content": "x"}]) as stream:
        for _ in stream:
            pass


def anthropic_with_blocks(count: int) -> bytes:
    """An Anthropic answer of ``count`` one-word text blocks, each started, filled and stopped."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
               "stop_reason": None, "usage": {"input_tokens": 3, "output_tokens": 1}}
    out = [_sse("message_start", {"type": "message_start", "message": message})]
    for i in range(count):
        out.append(_sse("content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}))
        out.append(_sse("content_block_delta",
                        {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": "w "}}))
        out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                      "usage": {"output_tokens": count}}))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def openai_chat_with_tool_calls(count: int) -> bytes:
    """A chat answer that opens a new tool call (a new index) in every chunk."""
    base = {"id": "chatcmpl-T1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-test-1"}
    out = []
    for i in range(count):
        call = {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        out.append(_sse(None, {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}))
    out.append(_sse(None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
    return b"".join(out) + _sse(None, "[DONE]")


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


# -- real captures -------------------------------------------------------------------------


@dataclass
class Captured:
    name: str
    body: bytes
    request: RequestInfo | None = None
    content_type: str | None = None
    status: int = 200


def chunk_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def chunk_objects(path: Path) -> list[dict]:
    """The JSON objects of a chunks file, one per line; none where any line is not one."""
    objects = []
    for line in chunk_lines(path):
        try:
            obj = orjson.loads(line)
        except ValueError:
            return []
        if not isinstance(obj, dict):
            return []
        objects.append(obj)
    return objects


def frame_chat(lines: list[bytes], done: bool = True) -> bytes:
    """Constructed SSE framing for Chat Completions payloads: ``data: <line>`` then ``[DONE]``."""
    return b"".join(b"data: " + line + b"\n\n" for line in lines) + (b"data: [DONE]\n\n" if done else b"")


def frame_responses(lines: list[bytes]) -> bytes:
    """Constructed SSE framing for Responses payloads: ``event: <type>`` + ``data: <line>``."""
    out = []
    for line in lines:
        kind = orjson.loads(line).get("type", "message")
        out.append(b"event: " + kind.encode() + b"\ndata: " + line + b"\n\n")
    return b"".join(out)


def frame_gemini_sse(lines: list[bytes]) -> bytes:
    """Constructed SSE framing for Gemini payloads, CRLF like the real API."""
    return b"".join(b"data: " + line + b"\r\n\r\n" for line in lines)


def frame_gemini_array(lines: list[bytes], close: bool = True) -> bytes:
    """Constructed JSON-array framing (``alt=json``): ``[`` elements ``,`` ... ``]``."""
    return b"[" + b",\r\n".join(lines) + (b"]" if close else b"")


def vercel(*parts: str) -> Path:
    return FIXTURES.joinpath("vercel-ai", *parts)


def cassette_responses(pattern: str) -> list[Captured]:
    """Every interaction's response body from the cassettes matching ``pattern``, with its request."""
    found = []
    for path in sorted(FIXTURES.glob(pattern)):
        document = yaml.safe_load(path.read_text())
        for number, interaction in enumerate(document.get("interactions") or []):
            request, response = interaction["request"], interaction["response"]
            body = (response.get("body") or {}).get("string")
            if body is None:
                continue
            body = body if isinstance(body, bytes) else body.encode("utf-8")
            headers = {k.lower(): (v[0] if isinstance(v, list) else v) for k, v in (response.get("headers") or {}).items()}
            req_body = request.get("parsed_body", request.get("body"))
            if isinstance(req_body, (dict, list)):
                req_body = orjson.dumps(req_body)
            elif isinstance(req_body, str):
                req_body = req_body.encode()
            info = RequestInfo(request.get("method", "POST"), request["uri"], {}, req_body)
            status = int((response.get("status") or {}).get("code", 200))
            found.append(Captured(f"{path.relative_to(FIXTURES)}#{number}", body, info, headers.get("content-type"), status))
    return found


def sse_spans(body: bytes) -> list[tuple[int, int]]:
    decoder = SSEDecoder()
    events = decoder.feed(body) + decoder.close()
    return [(e.start, e.end) for e in events if not isinstance(e, Tail)]


def cut_points(body: bytes, spans: list[tuple[int, int]], inside_per_event: int = 1, seed: int = 7) -> list[int]:
    """Every event boundary but the last, plus sampled offsets strictly inside events."""
    rng = random.Random(seed)
    points = {end for _, end in spans[:-1]}
    for start, end in spans:
        for _ in range(inside_per_event):
            if end - start > 2:
                points.add(rng.randrange(start + 1, end - 1))
    return sorted(p for p in points if 0 < p < len(body) and body[p:].strip())
