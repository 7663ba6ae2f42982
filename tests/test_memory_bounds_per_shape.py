"""Memory per stream stays bounded for shapes that grew it: Gemini partialArgs (each part may name a
new path, or an array index that makes its slots), Anthropic event names that differ from their
type, unmodelled delta types and fields, and `verify`'s list of event arrivals. Each is fed at two
sizes; what the open stream holds must not grow with the second."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from streamtap.commands.verify import VERIFY_KEEPS
from streamtap.providers import StreamSession, VerdictKind

CAP = 50_000  # the session's arguments cap for these tests (the proxy's is 4 Mi characters)


def held_after(session: StreamSession, chunks) -> int:
    """Bytes the open session holds after ``chunks``, fed 64 KiB at a time."""
    tracemalloc.start()
    try:
        buf = bytearray()
        for chunk in chunks:
            buf += chunk
            if len(buf) > 65536:
                session.feed(bytes(buf))
                buf.clear()
        session.feed(bytes(buf))
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def gemini(part: dict, finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": [part]}, "index": 0, **({"finishReason": finish} if finish else {})}
    return b"data: " + json.dumps({"candidates": [candidate]}).encode() + b"\n\n"


def partial_args(count: int, path: str):
    for i in range(count):
        yield gemini({"functionCall": {"partialArgs": [{"jsonPath": path.format(i=i), "stringValue": "v"}], "willContinue": True}})


@pytest.mark.parametrize("path", ["$.k{i}[9000]", "$.k{i}", "$.a.b{i}"], ids=["array-index", "new-key", "deep-key"])
def test_gemini_partial_args_are_charged_to_the_arguments_cap(path):
    held = []
    for count in (2_000, 8_000):
        session = StreamSession("gemini", "sse", keep_arrivals=False, arguments_cap=CAP)
        session.feed(gemini({"functionCall": {"name": "f", "willContinue": True}}))
        held.append(held_after(session, partial_args(count, path)))
        session.feed(gemini({"functionCall": {}}) + gemini({"text": ""}, "STOP"))
        analysis = session.close()
        assert analysis.verdict.kind is not VerdictKind.COMPLETE, analysis.verdict  # arguments not kept whole
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def anthropic(name: str, payload: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


START = [
    anthropic("message_start", {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "c",
                                                                      "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}),
    anthropic("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
]
SHAPES = {
    "renamed": lambda i: f'event: e{i}\ndata: {{"type":"ping"}}\n\n'.encode(),
    "delta-types": lambda i: anthropic("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": f"d{i}_delta", "x": "v"}}),
    "delta-fields": lambda i: anthropic("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", f"f{i}": "v"}}),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_anthropic_names_and_unmodelled_deltas_do_not_grow_the_turn(shape):
    held = []
    for count in (5_000, 20_000):
        session = StreamSession("anthropic", "sse", keep_arrivals=False)
        session.feed(b"".join(START))
        held.append(held_after(session, (SHAPES[shape](i) for i in range(count))))
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def test_verify_keeps_no_arrival_per_event():
    """One float per event would grow verify's memory with the recording (the README says it does not)."""
    session = StreamSession("openai-chat", "sse", **VERIFY_KEEPS)
    session.feed(b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n' * 100, 0.5)
    assert session.close().turn.timing.arrivals in ([], None)
