"""Constructed provider streams and recordings for the replay tests.

The streams follow the documented wire shapes (docs/provider-streams.md in ../shared):
OpenAI chat completions with text then a tool call, Anthropic messages with thinking,
text and tool use, Bedrock InvokeModelWithResponseStream carrying Anthropic events.
Recordings are written with streamtap.recording's writer.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from streamtap.wire import encode_message

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
RESPONSES_URL = "https://api.openai.com/v1/responses"
ANTHROPIC_URL = "https://api.anthropic.com/v1/messages"
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
BEDROCK_URL = f"https://bedrock-runtime.us-east-1.amazonaws.com/model/{BEDROCK_MODEL}/invoke-with-response-stream"

OPENAI_REQUEST = {"model": "gpt-4.1-nano", "stream": True, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
RESPONSES_REQUEST = {"model": "gpt-4.1-nano", "stream": True, "input": "Capital of France?"}
ANTHROPIC_REQUEST = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 1024,
    "stream": True,
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
}
BEDROCK_REQUEST = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "Say hello"}],
}

WORDS = "The weather in Paris today is mild and \"sunny\" with a light breeze from the west".split(" ")


def _j(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def openai_chat_frames(words: int = 50, tool: bool = True) -> list[bytes]:
    base = {"id": "chatcmpl-T1", "object": "chat.completion.chunk", "created": 1770933892, "model": "gpt-4.1-nano"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        body = base | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return f"data: {_j(body)}\n\n".encode()

    frames = [chunk({"role": "assistant", "content": ""})]
    for i in range(words):
        frames.append(chunk({"content": ("" if i == 0 else " ") + WORDS[i % len(WORDS)]}))
    if tool:
        frames.append(chunk({"tool_calls": [{"index": 0, "id": "call_A1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}))
        for piece in ['{"city":', ' "Paris \\"Fr', 'ance\\""', "}"]:
            frames.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    frames.append(chunk({}, "tool_calls" if tool else "stop"))
    frames.append(b"data: [DONE]\n\n")
    return frames


def openai_text(frames: list[bytes]) -> str:
    out = []
    for f in frames:
        data = f.decode()[6:].strip()
        if data != "[DONE]":
            out.append(json.loads(data)["choices"][0]["delta"].get("content") or "")
    return "".join(out)


def anthropic_events(words: int = 20) -> list[dict]:
    events = [
        {"type": "message_start", "message": {"id": "msg_01A", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6", "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 472, "output_tokens": 2}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "User wants weather; call the tool."}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbc"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    ]
    for i in range(words):
        events.append({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": ("" if i == 0 else " ") + WORDS[i % len(WORDS)]}})
    events += [
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_01T1", "name": "get_weather", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"location": "San Fra'}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": 'ncisco, CA"}'}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 89}},
        {"type": "message_stop"},
    ]
    return events


def anthropic_frames(words: int = 20) -> list[bytes]:
    return [f"event: {e['type']}\ndata: {_j(e)}\n\n".encode() for e in anthropic_events(words)]


def bedrock_invoke_frames(words: int = 12) -> list[bytes]:
    events = [e for e in anthropic_events(words) if e.get("index") != 0 and e["type"] != "ping"]
    events = [e | {"index": e["index"] - 1} if "index" in e else e for e in events]  # no thinking block here
    events[-1] = events[-1] | {"amazon-bedrock-invocationMetrics": {"inputTokenCount": 10, "outputTokenCount": 15, "invocationLatency": 1798, "firstByteLatency": 1507}}
    frames = []
    for e in events:
        payload = _j({"bytes": base64.b64encode(_j(e).encode()).decode(), "p": "abcdefgh"}).encode()
        frames.append(encode_message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}, payload))
    return frames


KINDS = {
    "openai": (OPENAI_URL, OPENAI_REQUEST, "sse", "openai-chat", "text/event-stream"),
    "responses": (RESPONSES_URL, RESPONSES_REQUEST, "sse", "openai-responses", "text/event-stream"),
    "anthropic": (ANTHROPIC_URL, ANTHROPIC_REQUEST, "sse", "anthropic", "text/event-stream"),
    "bedrock": (BEDROCK_URL, BEDROCK_REQUEST, "eventstream", "bedrock-invoke", "application/vnd.amazon.eventstream"),
}


def write_recording(
    path: Path,
    kind: str,
    frames: list[bytes],
    *,
    gap_ms: float = 1.0,
    request: dict | None = None,
    stream_end: str = "finished",
    url: str | None = None,
    redact: tuple[str, ...] = (),
) -> Path:
    """A recording (streamtap.recording's writer) of `frames` as the answer to the `kind` request,
    one network read per frame, `gap_ms` apart; ``redact``: the recorder's streamtap_redact names."""
    from streamtap.recording import RecordingWriter
    from streamtap.wire import EventStreamDecoder, SSEDecoder

    kind_url, default_request, wire, dialect, content_type = KINDS[kind]
    url = url or kind_url
    writer = RecordingWriter(path, redact=redact)
    writer.header(
        {
            "request": {"method": "POST", "url": url, "headers": [["content-type", "application/json"]], "body": request or default_request},
            "response": {"status": 200, "headers": [["content-type", content_type]]},
            "dialect": dialect,
            "wire": {"format": wire, "content_encoding": None},
        }
    )
    decoder = EventStreamDecoder() if wire == "eventstream" else SSEDecoder()
    for i, raw in enumerate(frames):
        writer.read(raw, i * gap_ms)
        for event in decoder.feed(raw):
            writer.frame(event, i * gap_ms)
    for event in decoder.close():
        writer.frame(event, len(frames) * gap_ms)
    writer.finish({"stream_end": stream_end})
    return path


def write_recordings(directory: Path) -> Path:
    """The three standard recordings (openai, anthropic, bedrock), default frames, in ``directory``."""
    write_recording(directory / "openai.jsonl", "openai", openai_chat_frames())
    write_recording(directory / "anthropic.jsonl", "anthropic", anthropic_frames())
    write_recording(directory / "bedrock.jsonl", "bedrock", bedrock_invoke_frames())
    return directory


def dechunk(data: bytes) -> tuple[list[bytes], bool]:
    """The chunks of an HTTP/1.1 response's chunked body and whether the terminating 0-chunk came."""
    head, _, rest = data.partition(b"\r\n\r\n")
    chunks = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return chunks, True
        chunks.append(rest[:size])
        rest = rest[size + 2 :]
    return chunks, False
