"""Streams the tests build themselves, for the parts that the real captures in ../shared/
otherwise cover alone: OpenAI Responses reasoning and function calls, Gemini tool calls
(whole and Vertex-streamed arguments), and sniffing a dialect from raw bytes. A clone
without ../shared/ still runs every dialect's tool-call, reasoning and sniffing paths here.

Shapes follow docs/provider-streams.md; every body is judged whole, in 1..7-byte reads, and
cut at every event boundary and inside events (a cut is never complete).
"""

from __future__ import annotations

import json

import orjson
import pytest

import provider_streams as streams
from provider_streams import C, X, _sse, cut_points, frame_gemini_array, frame_gemini_sse, sse_spans
from streamtap.providers import BlockKind, Dialect, analyze_bytes, sniff_dialect

RESPONSES, GEMINI = Dialect.OPENAI_RESPONSES, Dialect.GEMINI


def responses_with_reasoning_and_a_call(*, done_arguments: str | None = None) -> bytes:
    """A Responses stream: a reasoning summary, a function call whose arguments arrive in
    deltas, then a message; ``done_arguments`` overrides what the .done events repeat."""
    args = ['{"city":', ' "Paris"', "}"]
    whole = "".join(args)
    done_arguments = whole if done_arguments is None else done_arguments
    seq = iter(range(1000))
    resp = {"id": "resp_G1", "object": "response", "created_at": 1770000000, "status": "in_progress", "model": "gpt-test-5", "output": [], "usage": None}
    reasoning = {"id": "rs_G1", "type": "reasoning", "summary": []}
    call = {"id": "fc_G1", "type": "function_call", "status": "in_progress", "call_id": "call_G1", "name": "get_weather", "arguments": ""}
    message = {"id": "msg_G1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}

    def ev(kind: str, **fields) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

    summary = "Look up the weather first."
    # the final response lists each item as done, its summary included (as OpenAI sends it)
    done_reasoning = {**reasoning, "summary": [{"type": "summary_text", "text": summary}], "encrypted_content": "gAAA-sig"}
    out = [
        ev("response.created", response=resp),
        ev("response.output_item.added", output_index=0, item=reasoning),
        ev("response.reasoning_summary_part.added", item_id="rs_G1", output_index=0, summary_index=0, part={"type": "summary_text", "text": ""}),
        ev("response.reasoning_summary_text.delta", item_id="rs_G1", output_index=0, summary_index=0, delta="Look up "),
        ev("response.reasoning_summary_text.delta", item_id="rs_G1", output_index=0, summary_index=0, delta="the weather first."),
        ev("response.reasoning_summary_text.done", item_id="rs_G1", output_index=0, summary_index=0, text=summary),
        ev("response.reasoning_summary_part.done", item_id="rs_G1", output_index=0, summary_index=0, part={"type": "summary_text", "text": summary}),
        ev("response.output_item.done", output_index=0, item=done_reasoning),
        ev("response.output_item.added", output_index=1, item=call),
    ]
    out += [ev("response.function_call_arguments.delta", item_id="fc_G1", output_index=1, delta=piece) for piece in args]
    done_call = {**call, "status": "completed", "arguments": done_arguments}
    out += [
        ev("response.function_call_arguments.done", item_id="fc_G1", output_index=1, arguments=done_arguments),
        ev("response.output_item.done", output_index=1, item=done_call),
        ev("response.output_item.added", output_index=2, item=message),
        ev("response.content_part.added", item_id="msg_G1", output_index=2, content_index=0, part={"type": "output_text", "text": "", "annotations": []}),
        ev("response.output_text.delta", item_id="msg_G1", output_index=2, content_index=0, delta="Checking Paris.", logprobs=[]),
        ev("response.output_text.done", item_id="msg_G1", output_index=2, content_index=0, text="Checking Paris.", logprobs=[]),
    ]
    done_part = {"type": "output_text", "text": "Checking Paris.", "annotations": []}
    done_message = {**message, "status": "completed", "content": [done_part]}
    usage = {"input_tokens": 20, "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 12}, "total_tokens": 50}
    out += [
        ev("response.content_part.done", item_id="msg_G1", output_index=2, content_index=0, part=done_part),
        ev("response.output_item.done", output_index=2, item=done_message),
        ev("response.completed", response={**resp, "status": "completed", "output": [done_reasoning, done_call, done_message], "usage": usage}),
    ]
    return b"".join(out)


def gemini_chunks(*, streamed_arguments: bool = False) -> list[dict]:
    """Gemini chunks: a thought, text, a function call (whole ``args``, or Vertex's
    ``partialArgs`` over several chunks), the last chunk with STOP and usage."""

    def chunk(parts: list[dict], **extra) -> dict:
        return {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0, **extra}], "modelVersion": "gemini-test"}

    chunks = [chunk([{"text": "The user wants weather.", "thought": True}]), chunk([{"text": "Let me check."}])]
    if streamed_arguments:
        chunks += [
            chunk([{"functionCall": {"name": "get_weather", "willContinue": True, "partialArgs": [{"jsonPath": "$.city", "stringValue": "Pa"}]}}]),
            chunk([{"functionCall": {"willContinue": True, "partialArgs": [{"jsonPath": "$.city", "stringValue": "ris"}, {"jsonPath": "$.days", "numberValue": 3}]}}]),
            chunk([{"functionCall": {}}]),
        ]
    else:
        chunks.append(chunk([{"functionCall": {"name": "get_weather", "args": {"city": "Paris", "days": 3}}}]))
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 8, "thoughtsTokenCount": 5, "totalTokenCount": 23}
    chunks.append({**chunk([], finishReason="STOP"), "usageMetadata": usage})
    return chunks


def judged_every_way(body: bytes, dialect: Dialect, wire: str | None = None):
    """The analysis of the whole body, checked equal for small reads."""
    whole = analyze_bytes(body, dialect, wire=wire)
    for size in (1, 7):
        small = analyze_bytes(body, dialect, wire=wire, chunk_size=size)
        assert small.verdict.kind == whole.verdict.kind and small.turn.to_dict() == whole.turn.to_dict(), size
    return whole


def assert_cuts_never_complete(body: bytes, dialect: Dialect, wire: str | None = None) -> None:
    points = cut_points(body, sse_spans(body), inside_per_event=3) if wire != "json-array" else range(1, len(body), 5)
    assert points
    for point in points:
        verdict = analyze_bytes(body[:point], dialect, wire=wire).verdict
        assert verdict.kind is not C, (point, verdict)


def test_responses_reasoning_call_and_message():
    body = responses_with_reasoning_and_a_call()
    analysis = judged_every_way(body, RESPONSES)
    turn = analysis.turn
    assert analysis.verdict.kind is C, analysis.verdict
    assert [b.kind for b in turn.blocks] == [BlockKind.THINKING, BlockKind.TOOL_CALL, BlockKind.TEXT]
    assert turn.thinking() == "Look up the weather first." and turn.blocks[0].signature == "gAAA-sig"
    (call,) = turn.tool_calls()
    assert (call.id, call.name, call.arguments_raw, call.arguments) == ("call_G1", "get_weather", '{"city": "Paris"}', {"city": "Paris"})
    assert turn.text() == "Checking Paris."
    assert (turn.usage.input, turn.usage.output, turn.usage.reasoning) == (20, 30, 12)
    assert_cuts_never_complete(body, RESPONSES)


def test_responses_arguments_done_that_contradict_the_deltas_are_corrupt():
    analysis = analyze_bytes(responses_with_reasoning_and_a_call(done_arguments='{"city": "Lyon"}'), RESPONSES)
    assert analysis.verdict.kind is X and "disagree" in analysis.verdict.reason and analysis.verdict.evidence["tool"] == "get_weather", analysis.verdict


def test_responses_event_for_an_item_never_added_is_corrupt():
    body = responses_with_reasoning_and_a_call()
    stray = _sse("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta", "item_id": "fc_nope", "output_index": 9, "delta": "{"})
    cut = body.index(b"event: response.completed")
    analysis = analyze_bytes(body[:cut] + stray + body[cut:], RESPONSES)
    assert analysis.verdict.kind is X and "never added" in analysis.verdict.reason, analysis.verdict


@pytest.mark.parametrize("streamed_arguments", [False, True], ids=["args", "partialArgs"])
@pytest.mark.parametrize("wire", ["sse", "json-array"])
def test_gemini_thought_text_and_a_tool_call(wire, streamed_arguments):
    lines = [orjson.dumps(c) for c in gemini_chunks(streamed_arguments=streamed_arguments)]
    body = frame_gemini_sse(lines) if wire == "sse" else frame_gemini_array(lines)
    analysis = judged_every_way(body, GEMINI, wire)
    turn = analysis.turn
    assert analysis.verdict.kind is C, analysis.verdict
    assert [b.kind for b in turn.blocks] == [BlockKind.THINKING, BlockKind.TEXT, BlockKind.TOOL_CALL]
    assert turn.thinking() == "The user wants weather." and turn.text() == "Let me check."
    (call,) = turn.tool_calls()
    assert call.name == "get_weather" and call.arguments == {"city": "Paris", "days": 3}
    assert json.loads(call.arguments_raw) == call.arguments
    assert (turn.usage.input, turn.usage.total) == (10, 23)
    assert_cuts_never_complete(body, GEMINI, wire)


SNIFFED = [
    ("openai-chat", lambda: streams.openai_chat(["Hel", "lo"]), "sse"),
    ("openai-responses", responses_with_reasoning_and_a_call, "sse"),
    ("anthropic", lambda: streams.anthropic("hmm", "Hello", {"city": "Paris"}), "sse"),
    ("bedrock-invoke", lambda: streams.bedrock_invoke("hmm", "Hello", {"city": "Paris"}), "eventstream"),
    ("bedrock-converse", lambda: streams.bedrock_converse(["Hel", "lo"], {"city": "Paris"}), "eventstream"),
    ("gemini", lambda: frame_gemini_sse([orjson.dumps(c) for c in gemini_chunks()]), "sse"),
    ("gemini", lambda: frame_gemini_array([orjson.dumps(c) for c in gemini_chunks()]), "json-array"),
    ("ollama", lambda: b"".join(orjson.dumps(line) + b"\n" for line in [
        {"model": "qwen3", "created_at": "2026-01-01T00:00:00Z", "message": {"role": "assistant", "content": "Hi"}, "done": False},
        {"model": "qwen3", "created_at": "2026-01-01T00:00:01Z", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop"},
    ]), "ndjson"),
]


@pytest.mark.parametrize(("dialect", "build", "wire"), SNIFFED, ids=[f"{d}-{w}" for d, _, w in SNIFFED])
def test_sniffing_names_the_dialect_and_wire_of_raw_bytes(dialect, build, wire):
    body = build()
    detection = sniff_dialect(body)
    assert (str(detection.dialect), detection.wire) == (dialect, wire), detection
    assert detection.why
    assert analyze_bytes(body, detection.dialect, wire=detection.wire).verdict.kind is C


def test_sniffing_bytes_that_are_no_stream_says_unknown():
    for junk in (b"# A README\n\nNot a stream.\n", bytes(range(256))):
        detection = sniff_dialect(junk)
        assert str(detection.dialect) == "unknown", detection


# The contentview checks of tests/test_contentview.py (rendering compared with botocore's and
# httpx-sse's decoders), run on generated bodies: without ../shared/ they have no input.
GENERATED_BODIES = {
    "bedrock-invoke.bin": lambda: streams.bedrock_invoke("hmm", "Hello", {"city": "Paris"}),
    "bedrock-converse.bin": lambda: streams.bedrock_converse(["Hel", "lo"], {"city": "Paris"}),
    "openai-chat.sse": lambda: streams.openai_chat(["Hel", "lo"]),
    "anthropic.sse": lambda: streams.anthropic("hmm", "Hello", {"city": "Paris"}),
    "openai-responses.sse": responses_with_reasoning_and_a_call,
}


@pytest.mark.parametrize("name", sorted(GENERATED_BODIES))
def test_contentviews_render_generated_bodies_frame_by_frame(name, tmp_path):
    import test_contentview

    path = tmp_path / name
    path.write_bytes(GENERATED_BODIES[name]())
    if name.endswith(".bin"):
        test_contentview.test_eventstream_messages_headers_payloads_and_invoke_chunks(path)
    else:
        test_contentview.test_sse_events_with_json_data(path)
