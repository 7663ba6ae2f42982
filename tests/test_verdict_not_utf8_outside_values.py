"""Bytes that are not UTF-8 in an SSE line whose value no event keeps (a comment, a ``retry``, an
ignored field): the anthropic and openai SDKs decode every line strictly and raise, so the answer is
corrupt, never complete. Before and after the last event alike."""

from __future__ import annotations

import anthropic._streaming as anthropic_streaming
import openai._streaming as openai_streaming
import orjson
import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
           "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def sse(*events: dict, named: bool = True) -> bytes:
    return b"".join((f"event: {e['type']}\n".encode() if named else b"") + b"data: " + orjson.dumps(e) + b"\n\n"
                    for e in events)


def anthropic_answer(between: bytes = b"", after: bytes = b"") -> bytes:
    def delta(text: str) -> dict:
        return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}

    return (
        sse({"type": "message_start", "message": MESSAGE},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            delta("Hello"))
        + between
        + sse(delta(" world"), {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
               "usage": {"output_tokens": 2}},
              {"type": "message_stop"})
        + after
    )


def chat_answer(between: bytes = b"", after: bytes = b"") -> bytes:
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    return (sse(chunk({"role": "assistant", "content": "Hello"}), named=False) + between
            + sse(chunk({"content": " world"}), chunk({}, "stop"), named=False) + b"data: [DONE]\n\n" + after)


NOT_UTF8_LINES = [b": keep-alive \xff\n\n", b"retry: 1\xff\n\n", b"x-note: \xe2\x82\n\n", b": \xc3\n"]


def sdk_raises(body: bytes) -> None:
    for module in (anthropic_streaming, openai_streaming):
        with pytest.raises(UnicodeDecodeError):
            list(module.SSEDecoder().iter_bytes(iter([body])))


@pytest.mark.parametrize("line", NOT_UTF8_LINES)
@pytest.mark.parametrize("dialect,answer", [(Dialect.ANTHROPIC, anthropic_answer), (Dialect.OPENAI_CHAT, chat_answer)])
def test_between_events_the_answer_is_corrupt(dialect: Dialect, answer, line: bytes) -> None:
    assert analyze_bytes(answer(), dialect).verdict.kind is VerdictKind.COMPLETE
    body = answer(between=line)
    sdk_raises(body)
    verdict = analyze_bytes(body, dialect).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "not valid UTF-8" in verdict.reason, verdict


@pytest.mark.parametrize("line", NOT_UTF8_LINES[:3])
@pytest.mark.parametrize("dialect,answer", [(Dialect.ANTHROPIC, anthropic_answer), (Dialect.OPENAI_CHAT, chat_answer)])
def test_after_the_last_event_the_answer_is_corrupt(dialect: Dialect, answer, line: bytes) -> None:
    body = answer(after=line)
    sdk_raises(body)
    verdict = analyze_bytes(body, dialect).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "not valid UTF-8" in verdict.reason, verdict
