"""Bytes that are not UTF-8 in an SSE line whose value no event keeps (a comment, a ``retry``, an
ignored field): the anthropic and openai SDKs decode every line they read strictly and raise, so the
answer is corrupt, never complete. Before and after the last event alike, but for lines after a Chat
Completions ``[DONE]``, where the openai SDK stops reading (the sync client closes the response; the
async one drains it without decoding): the answer stays complete, with a note."""

from __future__ import annotations

import asyncio

import anthropic._streaming as anthropic_streaming
import httpx
import openai
import openai._streaming as openai_streaming
import orjson
import pytest
from provider_streams import read_with_anthropic_sdk

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
def test_after_the_last_anthropic_event_the_answer_is_corrupt(line: bytes) -> None:
    """The anthropic SDK reads the body to its end, past ``message_stop``."""
    body = anthropic_answer(after=line)
    sdk_raises(body)
    with pytest.raises(UnicodeDecodeError):
        read_with_anthropic_sdk(body)
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "not valid UTF-8" in verdict.reason, verdict


def _openai_client(body: bytes, client_class=openai.OpenAI, http_class=httpx.Client):
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return client_class(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                        http_client=http_class(transport=httpx.MockTransport(upstream)))


REQUEST = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def openai_sdk_text(body: bytes) -> tuple[str, str]:
    """The text an app's ``create(stream=True)`` loop gets, on the sync and on the async client."""
    sync = "".join(c.choices[0].delta.content or "" for c in _openai_client(body).chat.completions.create(**REQUEST))

    async def read() -> str:
        client = _openai_client(body, openai.AsyncOpenAI, httpx.AsyncClient)
        return "".join([c.choices[0].delta.content or "" async for c in await client.chat.completions.create(**REQUEST)])

    return sync, asyncio.run(read())


# (a field no provider sends leaves the answer unknown wherever it is: see test_verdict_fused_comment.py)
@pytest.mark.parametrize("line", [line for line in NOT_UTF8_LINES if not line.startswith(b"x-")])
def test_after_done_the_chat_answer_stays_complete_as_the_openai_sdk_stopped_reading(line: bytes) -> None:
    body = chat_answer(after=line)
    sdk_raises(body)  # its decoder would fail on the line, had the SDK read that far
    assert openai_sdk_text(body) == ("Hello world", "Hello world")
    for size in (None, 1, 5):
        verdict = analyze_bytes(body, Dialect.OPENAI_CHAT, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.COMPLETE, (size, verdict)
        assert "not UTF-8" in verdict.reason and "stopped reading" in verdict.reason, (size, verdict)
        assert verdict.evidence["not_utf8_after_end_signal"] >= 1, verdict.evidence
    # the same line before [DONE] is read, and fails
    before_done = chat_answer(after=line).replace(b"data: [DONE]\n\n" + line, line + b"data: [DONE]\n\n")
    with pytest.raises(UnicodeDecodeError):
        openai_sdk_text(before_done)
    assert analyze_bytes(before_done, Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.CORRUPT
