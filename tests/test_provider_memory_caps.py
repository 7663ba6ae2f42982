"""What a turn keeps of a provider's usage objects and in-band errors stays bounded.

Anthropic's message_delta (and Bedrock InvokeModel's Claude chunks, read by the same builder) merges
its ``usage`` into the turn's: a stream whose every message_delta names a new usage field grew the
turn, and the recording's end line, without bound (1.6 M events: +174 MiB). A provider's error
message went whole into the verdict's reason (a 4 MB message: a 4 MB reason, copied into the log
line, the flow's comment and the end line). Constructed streams; the real captures' usage is kept whole.
"""

from __future__ import annotations

import base64
import gc
import json
import tracemalloc

import orjson
import pytest
from test_memory_bounds_per_shape import held_after

from streamtap.providers import StreamSession, VerdictKind
from streamtap.providers.anthropic import USAGE_FIELDS
from streamtap.providers.judge import MAX_ERROR_TEXT, MAX_USAGE_FIELDS, MAX_USAGE_NAME, MAX_USAGE_VALUE
from streamtap.wire import encode_message
from provider_streams import vercel

HUGE = 4 * 1024 * 1024  # characters of the huge values below
HUGE_SAID = f"({HUGE:,} characters)"


def anthropic(payload: dict) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


START = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
                                              "content": [], "stop_reason": None, "stop_sequence": None,
                                              "usage": {"input_tokens": 5, "output_tokens": 1}}}
TEXT = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0}]
END = [{"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 10}},
       {"type": "message_stop"}]


def usage_delta(usage: dict) -> dict:
    return {"type": "message_delta", "delta": {}, "usage": usage}


def new_names(count: int):
    """message_deltas each naming a new usage field."""
    return (usage_delta({"output_tokens": i, f"k{i:09d}": i}) for i in range(count))


def invoke_chunk(event: dict) -> bytes:
    inner = base64.b64encode(json.dumps(event).encode()).decode()
    return encode_message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
                          json.dumps({"bytes": inner, "p": "abcdefgh"}).encode())


FRAMINGS = {"anthropic": ("sse", anthropic), "bedrock-invoke": ("eventstream", invoke_chunk)}


@pytest.mark.parametrize("dialect", FRAMINGS)
def test_usage_names_past_the_bound_are_counted_not_kept(dialect):
    wire, frame = FRAMINGS[dialect]
    held = []
    for count in (5_000, 20_000):
        session = StreamSession(dialect, wire, keep_arrivals=False)
        session.feed(b"".join(map(frame, [START, *TEXT])))
        held.append(held_after(session, map(frame, new_names(count))))
        session.feed(b"".join(map(frame, END)))
        analysis = session.close()
        assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict.reason
        usage = analysis.turn.usage
        assert len(usage.raw) == MAX_USAGE_FIELDS  # input_tokens and output_tokens, and 62 new names
        assert analysis.turn.extra["usage_fields_dropped"] == count - (MAX_USAGE_FIELDS - 2)
        assert (usage.input, usage.output) == (5, 10)
        assert any("usage_fields_dropped" in note for note in analysis.turn.notes)
        assert len(orjson.dumps(analysis.turn.to_dict())) < 16 * 1024  # the end line's turn
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def test_known_usage_names_are_kept_past_the_bound():
    """Names the SDK models are kept whatever came before them (a late cache count, say)."""
    late = usage_delta({"cache_read_input_tokens": 7, "server_tool_use": {"web_search_requests": 1}})
    analysis = judge_anthropic([START, *TEXT, *new_names(MAX_USAGE_FIELDS * 2), late, *END])
    usage = analysis.turn.usage
    assert usage.cache_read == 7 and usage.raw["server_tool_use"] == {"web_search_requests": 1}
    assert analysis.turn.extra["usage_fields_dropped"] == MAX_USAGE_FIELDS * 2 - (MAX_USAGE_FIELDS - 2)
    assert analysis.verdict.kind is VerdictKind.COMPLETE


def test_long_usage_names_and_values_are_counted_not_kept():
    """A name or a value too long to keep, a known name's too, is counted; the typed counts keep
    what came before it, usage.raw holds no value superseded by one not kept."""
    big = usage_delta({"x" * (MAX_USAGE_NAME + 1): 1, "input_tokens": "9" * HUGE,
                       "service_tier": "s" * (MAX_USAGE_VALUE + 1), "iterations": [{"input_tokens": 1}] * 5_000})
    session = StreamSession("anthropic", "sse", keep_arrivals=False)
    session.feed(b"".join(map(anthropic, [START, *TEXT])))
    assert held_after(session, [anthropic(big)]) < 256 * 1024
    session.feed(b"".join(map(anthropic, END)))
    analysis = session.close()
    usage = analysis.turn.usage
    assert usage.raw == {"output_tokens": 10} and usage.input == 5
    assert analysis.turn.extra["usage_fields_dropped"] == 4
    assert analysis.verdict.kind is VerdictKind.COMPLETE


def test_a_kept_usage_value_superseded_by_one_too_long_to_keep_is_not_shown():
    """A cumulative field (iterations) that grows past the bound in a later message_delta: the
    turn showed the older, smaller list as the stream's, while counting the field as not kept."""
    iterations = lambda count: [{"type": "message", "input_tokens": 1000 + i, "output_tokens": 50 + i, "pad": "x" * 100}
                                for i in range(count)]
    small, large = usage_delta({"iterations": iterations(10)}), usage_delta({"iterations": iterations(120)})
    analysis = judge_anthropic([START, *TEXT, small, large, *END])
    assert "iterations" not in analysis.turn.usage.raw, len(analysis.turn.usage.raw["iterations"])
    assert analysis.turn.extra["usage_fields_dropped"] == 1 and analysis.turn.usage.output == 10
    assert analysis.verdict.kind is VerdictKind.COMPLETE
    kept = judge_anthropic([START, *TEXT, large, small, *END])  # the control: the last value, small, is kept
    assert len(kept.turn.usage.raw["iterations"]) == 10 and kept.turn.extra["usage_fields_dropped"] == 1


def test_real_usage_is_kept_whole():
    """A real capture's usage (server tool counts, a list of iterations) is kept as it came."""
    path = vercel("anthropic", "anthropic-advisor-20250301.1.chunks.txt")
    if not path.is_file():
        pytest.skip("shared fixtures absent")
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    analysis = judge_anthropic(events)
    expected = {}
    for event in events:
        expected.update((event.get("message") or event).get("usage") or {})
    assert analysis.turn.usage.raw == expected and "iterations" in expected
    assert "usage_fields_dropped" not in analysis.turn.extra
    assert set(expected) <= USAGE_FIELDS


def judge_anthropic(events: list[dict]):
    session = StreamSession("anthropic", "sse", keep_arrivals=False)
    session.feed(b"".join(map(anthropic, events)))
    return session.close()


# -- in-band errors -------------------------------------------------------------------------------
def exception_frame(kind: str, payload: dict) -> bytes:
    return encode_message({":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"},
                          json.dumps(payload).encode())


def converse_frame(kind: str, payload: dict) -> bytes:
    return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                          json.dumps(payload).encode())


def sse(data: dict | str, event: str | None = None) -> bytes:
    data = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


M = "m" * HUGE
ERRORS = {  # dialect -> (wire, body with a huge error message)
    "anthropic": ("sse", anthropic(START) + anthropic({"type": "error", "error": {"type": "overloaded_error", "message": M}})),
    "anthropic-text": ("sse", anthropic(START) + sse(M, "error")),  # an error event whose data is no JSON
    "bedrock-invoke": ("eventstream", invoke_chunk(START) + exception_frame(
        "modelStreamErrorException", {"message": M, "originalStatusCode": 500, "originalMessage": M})),
    "bedrock-converse": ("eventstream", converse_frame("messageStart", {"role": "assistant"}) + exception_frame(
        "throttlingException", {"message": M})),
    "openai-chat": ("sse", sse({"error": {"message": M, "type": "server_error"}})),
    "openai-responses": ("sse", sse({"type": "error", "code": "server_error", "message": M, "sequence_number": 0}, "error")),
    "gemini": ("sse", sse({"error": {"code": 500, "message": M, "status": "INTERNAL"}})),
    "ollama": ("ndjson", json.dumps({"error": M}).encode() + b"\n"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_a_huge_error_message_is_shortened_with_its_length(case):
    wire, body = ERRORS[case]
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    tracemalloc.start()
    try:
        session = StreamSession(case.removesuffix("-text"), wire, keep_arrivals=False)
        for chunk in chunks:
            session.feed(chunk)
        analysis = session.close()
        del session  # (which keeps the body's first chunks whole, StartOver, in a cycle with its assembler)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.ERRORED, verdict.reason
    assert HUGE_SAID in verdict.reason and len(verdict.reason) < MAX_ERROR_TEXT + 100, verdict.reason[:300]
    for value in [*analysis.turn.error.values(), *verdict.evidence.values()]:
        assert not isinstance(value, str) or len(value) <= MAX_ERROR_TEXT
    assert held < 1024 * 1024, held  # the turn and the verdict hold a bounded part of the message


@pytest.mark.parametrize("dialect, body", [
    ("anthropic", anthropic(START) + anthropic({"type": "error", "error": {"type": "t" * HUGE, "message": "Overloaded"}})),
    ("openai-chat", sse({"error": {"message": "boom", "type": "t" * HUGE, "code": {"detail": ["c" * 100] * 100}}})),
], ids=["anthropic", "openai-chat"])
def test_every_field_of_an_error_is_kept_within_the_bound(dialect, body):
    session = StreamSession(dialect, "sse", keep_arrivals=False)
    session.feed(body)
    analysis = session.close()
    assert analysis.verdict.kind is VerdictKind.ERRORED
    assert HUGE_SAID in analysis.verdict.reason and len(analysis.verdict.reason) < MAX_ERROR_TEXT + 100
    assert all(len(str(value)) <= MAX_ERROR_TEXT for value in analysis.turn.error.values())
    assert len(orjson.dumps(analysis.verdict.to_dict())) < 4 * MAX_ERROR_TEXT


def test_short_error_messages_are_kept_as_they_were():
    message = "You exceeded your current quota, please check your plan and billing details. For more information on " \
              "this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
    session = StreamSession("openai-chat", "sse")
    session.feed(sse({"error": {"message": message, "type": "insufficient_quota"}}))
    assert session.close().verdict.reason == f"stream error insufficient_quota: {message}"  # (cut at 160 before)
    analysis = judge_anthropic([START, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}])
    assert analysis.verdict.reason == "stream error overloaded_error: Overloaded"
