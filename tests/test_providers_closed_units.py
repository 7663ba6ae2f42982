"""The general rule, in every dialect: an event that contradicts a unit the provider already closed
(a block, a choice, an output item, a message, the response) is corrupt, and the verdict names both
events; and a terminal signal whose event was never dispatched is truncated.

Streams are the wire-exact constructed ones from provider_streams.py with one event added or moved;
where the closing and contradicting events sit is read back with the wire decoders, not hard-coded.
"""

from __future__ import annotations

import base64
import json

import orjson
import pytest
from provider_streams import C, T, X, _sse, anthropic_events, bedrock_converse, openai_chat, openai_responses

from streamtap.providers import Dialect, StreamEnd, VerdictKind, analyze_bytes
from streamtap.wire import EventStreamDecoder, JSONValue, NDJSONDecoder, SSEDecoder, SSEEvent, encode_message

CHAT, RESPONSES, ANTHROPIC = Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC


def sse_events(body: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [e for e in decoder.feed(body) + decoder.close() if isinstance(e, SSEEvent)]


def sse_insert(body: bytes, after: int, *raw: bytes) -> bytes:
    """``raw`` events inserted after SSE event number ``after``."""
    cut = sse_events(body)[after].end
    return body[:cut] + b"".join(raw) + body[cut:]


def assert_names_both(verdict, body_events, closing: int, contradicting: int) -> None:
    """The verdict is corrupt and names the closing and the contradicting event: seq and byte of each."""
    assert verdict.kind is X, verdict
    closing_event, contradicting_event = body_events[closing], body_events[contradicting]
    assert (verdict.seq, verdict.offset) == (contradicting_event.seq, contradicting_event.start), verdict
    assert (verdict.evidence["closed_seq"], verdict.evidence["closed_offset"]) == (closing_event.seq, closing_event.start)
    assert f"at seq {contradicting_event.seq} (byte {contradicting_event.start})" in verdict.reason
    assert f"at seq {closing_event.seq} (byte {closing_event.start})" in verdict.reason


# -- OpenAI Chat Completions --------------------------------------------------------------


def chat_chunk(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"id": "chatcmpl-T1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-test-1",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return _sse(None, chunk)


def test_chat_content_after_the_finish_reason_is_corrupt_naming_both_events():
    body = openai_chat(["Hello", " world"])
    finish = 3  # role chunk, two text chunks, then the finish chunk
    assert orjson.loads(sse_events(body)[finish].data)["choices"][0]["finish_reason"] == "stop"
    late = sse_insert(body, finish, chat_chunk({"content": " and more"}))
    verdict = analyze_bytes(late, CHAT).verdict
    assert_names_both(verdict, sse_events(late), finish, finish + 1)
    assert "finish_reason stop" in verdict.reason


@pytest.mark.parametrize("delta", [
    {"tool_calls": [{"index": 0, "id": "call_x", "function": {"name": "f", "arguments": "{}"}}]},
    {"reasoning_content": "more thoughts"},
    {"refusal": "no"},
])
def test_chat_any_delta_after_the_finish_is_a_second_generation(delta):
    body = sse_insert(openai_chat(["Hi"]), 2, chat_chunk(delta))
    assert_names_both(analyze_bytes(body, CHAT).verdict, sse_events(body), 2, 3)


def test_chat_second_generation_with_the_same_chunk_id_is_corrupt():
    """A role chunk again, more text, another finish, all under the first generation's id."""
    first = openai_chat(["Hello", " world"], done=False)
    second = openai_chat(["Hello", " world"])
    stitched = first + second
    events = sse_events(stitched)
    assert len({orjson.loads(e.data)["id"] for e in events if e.data != "[DONE]"}) == 1
    analysis = analyze_bytes(stitched, CHAT)
    verdict = analysis.verdict
    assert verdict.kind is X, verdict
    restart = len(sse_events(first))
    assert (verdict.seq, verdict.offset) == (events[restart].seq, events[restart].start)
    assert "second generation" in verdict.reason
    # the same with the first generation cut before its finish: the second role chunk is a second start
    cut = first[: sse_events(first)[2].end]
    verdict = analyze_bytes(cut + second, CHAT).verdict
    assert verdict.kind is X and "second assistant start" in verdict.reason, verdict
    assert verdict.evidence["first_seq"] == 0 and verdict.seq == 3


def test_chat_event_after_done_is_corrupt():
    body = openai_chat(["Hi"])
    late = body + chat_chunk({"content": "late"})
    events = sse_events(late)
    verdict = analyze_bytes(late, CHAT).verdict
    assert_names_both(verdict, events, len(events) - 2, len(events) - 1)
    assert "data: [DONE]" in verdict.reason


def test_chat_role_on_every_chunk_and_an_empty_delta_after_the_finish_stay_complete():
    """OpenRouter's style: the role on every chunk, then a usage chunk with an empty delta after the finish."""
    body = b"".join([
        chat_chunk({"role": "assistant", "content": "Hel"}),
        chat_chunk({"role": "assistant", "content": "lo"}),
        chat_chunk({"role": "assistant", "content": ""}, "stop"),
        chat_chunk({"role": "assistant", "content": ""}),
        b"data: [DONE]\n\n",
    ])
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert analysis.turn.text() == "Hello"


# -- OpenAI Responses -----------------------------------------------------------------------


def responses_insert(body: bytes, after_type: str, event: dict) -> bytes:
    """``event`` inserted after the first event of ``after_type``; sequence numbers renumbered."""
    objects = [orjson.loads(e.data) for e in sse_events(body)]
    at = next(i for i, o in enumerate(objects) if o["type"] == after_type) + 1
    objects.insert(at, event)
    for number, obj in enumerate(objects):
        obj["sequence_number"] = number
    return b"".join(_sse(o["type"], o) for o in objects)


def text_delta(text: str, content_index: int = 0) -> dict:
    return {"type": "response.output_text.delta", "item_id": "msg_T1", "output_index": 0,
            "content_index": content_index, "delta": text, "logprobs": []}


@pytest.mark.parametrize(("after", "closing"), [
    ("response.output_item.done", "response.output_item.done"),
    ("response.output_text.done", "response.output_text.done"),
    ("response.content_part.done", "response.content_part.done"),
])
def test_responses_delta_after_its_unit_closed_is_corrupt(after, closing):
    body = responses_insert(openai_responses(["Hel", "lo"]), after, text_delta(" again"))
    events = sse_events(body)
    types = [orjson.loads(e.data)["type"] for e in events]
    verdict = analyze_bytes(body, RESPONSES).verdict
    assert_names_both(verdict, events, types.index(closing), types.index(after) + 1)
    assert closing in verdict.reason


def test_responses_function_arguments_after_their_done_are_corrupt():
    events = [
        {"type": "response.created", "response": {"id": "r", "output": []}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": '{"a":1}'},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 0, "arguments": '{"a":1}'},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": "}"},
    ]
    body = b"".join(_sse(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events))
    assert_names_both(analyze_bytes(body, RESPONSES).verdict, sse_events(body), 3, 4)


def test_responses_item_done_twice_is_corrupt():
    body = openai_responses(["Hi"])
    objects = [orjson.loads(e.data) for e in sse_events(body)]
    done = next(o for o in objects if o["type"] == "response.output_item.done")
    again = responses_insert(body, "response.output_item.done", dict(done))
    verdict = analyze_bytes(again, RESPONSES).verdict
    assert verdict.kind is X and "after output item 0 was closed by response.output_item.done" in verdict.reason


# -- Anthropic, Bedrock InvokeModel (Anthropic events), ConverseStream ------------------------------


def anthropic_body(events: list[dict]) -> bytes:
    return b"".join(_sse(e["type"], e) for e in events)


def late_text_delta(index: int) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": "late"}}


def test_anthropic_delta_after_content_block_stop_is_corrupt_naming_both_events():
    events = anthropic_events("think", "answer", {"city": "Paris"})
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop" and e["index"] == 1)
    events.insert(stop + 1, late_text_delta(1))
    body = anthropic_body(events)
    verdict = analyze_bytes(body, ANTHROPIC).verdict
    assert_names_both(verdict, sse_events(body), stop, stop + 1)
    assert "block 1 was closed by content_block_stop" in verdict.reason


def test_anthropic_message_delta_after_message_stop_is_corrupt():
    events = anthropic_events("think", "answer", {"city": "Paris"})
    events.append({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 99}})
    body = anthropic_body(events)
    verdict = analyze_bytes(body, ANTHROPIC).verdict
    assert_names_both(verdict, sse_events(body), len(events) - 2, len(events) - 1)


def invoke_body(events: list[dict]) -> bytes:
    out = []
    for event in events:
        payload = json.dumps({"bytes": base64.b64encode(json.dumps(event).encode()).decode(), "p": "ab"}).encode()
        out.append(encode_message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}, payload))
    return b"".join(out)


def frames(body: bytes):
    return EventStreamDecoder().feed(body)


def test_bedrock_invoke_delta_after_content_block_stop_is_corrupt():
    events = anthropic_events("think", "answer", {"city": "Paris"})
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop" and e["index"] == 0)
    events.insert(stop + 1, {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "x"}})
    body = invoke_body(events)
    assert_names_both(analyze_bytes(body, Dialect.BEDROCK_INVOKE).verdict, frames(body), stop, stop + 1)


def test_converse_delta_after_content_block_stop_is_corrupt():
    body = bedrock_converse(["Hel", "lo"], {"city": "Paris"})
    messages = frames(body)
    stop = next(i for i, m in enumerate(messages) if m.headers[":event-type"] == "contentBlockStop")
    late = encode_message({":event-type": "contentBlockDelta", ":content-type": "application/json", ":message-type": "event"},
                          json.dumps({"contentBlockIndex": 0, "delta": {"text": "late"}, "p": "x"}).encode())
    spliced = body[: messages[stop].end] + late + body[messages[stop].end:]
    verdict = analyze_bytes(spliced, Dialect.BEDROCK_CONVERSE).verdict
    assert_names_both(verdict, frames(spliced), stop, stop + 1)
    assert "contentBlockStop" in verdict.reason


def test_converse_content_after_message_stop_is_corrupt():
    body = bedrock_converse(["Hi"], {"city": "Paris"})
    messages = frames(body)
    stop = next(i for i, m in enumerate(messages) if m.headers[":event-type"] == "messageStop")
    late = encode_message({":event-type": "contentBlockDelta", ":content-type": "application/json", ":message-type": "event"},
                          json.dumps({"contentBlockIndex": 2, "delta": {"text": "late"}}).encode())
    spliced = body[: messages[stop].end] + late + body[messages[stop].end:]
    assert_names_both(analyze_bytes(spliced, Dialect.BEDROCK_CONVERSE).verdict, frames(spliced), stop, stop + 1)


# -- Gemini and Ollama ----------------------------------------------------------------------------


def gemini_chunk(text: str, finish: str | None = None) -> bytes:
    candidate: dict = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return b"data: " + orjson.dumps({"candidates": [candidate], "modelVersion": "gemini-test"}) + b"\r\n\r\n"


def test_gemini_content_after_the_finish_reason_is_corrupt():
    body = gemini_chunk("Hel") + gemini_chunk("lo", "STOP") + gemini_chunk(" again", "STOP")
    assert_names_both(analyze_bytes(body, Dialect.GEMINI).verdict, sse_events(body), 1, 2)
    limited = gemini_chunk("Hel", "MAX_TOKENS") + gemini_chunk("lo", "MAX_TOKENS")
    assert_names_both(analyze_bytes(limited, Dialect.GEMINI).verdict, sse_events(limited), 0, 1)


def test_gemini_content_after_a_stop_on_the_first_chunk_is_never_complete():
    """Early-2024 models stamped STOP on every chunk, so content after a first-chunk STOP is that, or a second
    generation appended (a one-chunk capture with itself appended): the bytes cannot tell, so unknown."""
    body = gemini_chunk("Hel", "STOP") + gemini_chunk("lo", "STOP")
    analysis = analyze_bytes(body, Dialect.GEMINI)
    assert analysis.verdict.kind.value == "unknown", analysis.verdict
    events = sse_events(body)
    assert (analysis.verdict.seq, analysis.verdict.offset) == (events[1].seq, events[1].start)
    assert analysis.verdict.evidence["stamped_offset"] == events[0].start
    assert analysis.turn.text() == "Hello"
    # a STOP on an early empty chunk (gateways do that) closes nothing
    empty_stop = b"data: " + orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                                                           "finishReason": "STOP", "index": 0}]}) + b"\r\n\r\n"
    assert analyze_bytes(empty_stop + gemini_chunk("Hel") + gemini_chunk("lo", "STOP"), Dialect.GEMINI).verdict.kind is C


def ndjson_events(body: bytes) -> list[JSONValue]:
    decoder = NDJSONDecoder()
    return [e for e in decoder.feed(body) + decoder.close() if isinstance(e, JSONValue)]


def test_ollama_line_after_done_is_corrupt():
    lines = [{"model": "m", "message": {"role": "assistant", "content": "Hi"}, "done": False},
             {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop"},
             {"model": "m", "message": {"role": "assistant", "content": "again"}, "done": False}]
    body = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    verdict = analyze_bytes(body, Dialect.OLLAMA).verdict
    assert_names_both(verdict, ndjson_events(body), 1, 2)


# -- a terminal signal whose event was never dispatched ------------------------------------------------


def _ollama_body() -> bytes:
    lines = [{"model": "m", "message": {"role": "assistant", "content": "Hi"}, "done": False},
             {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop"}]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


TERMINAL_CASES = {
    "openai-chat": (CHAT, openai_chat(["Hello"]), 1),  # ends "data: [DONE]\n"
    "openai-responses": (RESPONSES, openai_responses(["Hello"]), 1),
    "anthropic": (ANTHROPIC, anthropic_body(anthropic_events("t", "a", {"x": 1})), 1),
    "gemini": (Dialect.GEMINI, gemini_chunk("Hel") + gemini_chunk("lo", "STOP"), 2),  # CRLF: the last CRLF goes
    "ollama": (Dialect.OLLAMA, _ollama_body(), 1),  # the done line without its newline
}


# google-genai and the ollama client read a last line without its line end at the end of the body
SDK_READS_UNENDED = {"gemini", "ollama"}


@pytest.mark.parametrize("name", sorted(TERMINAL_CASES))
@pytest.mark.parametrize("end", [StreamEnd.FINISHED, StreamEnd.UPSTREAM_RESET])
def test_terminal_event_never_dispatched_is_truncated(name, end):
    dialect, body, missing = TERMINAL_CASES[name]
    assert analyze_bytes(body, dialect).verdict.kind is C
    verdict = analyze_bytes(body[:-missing], dialect, end=end).verdict
    if name in SDK_READS_UNENDED and end is StreamEnd.FINISHED:
        assert verdict.kind is C and verdict.evidence["body_ended_without_line_end"] is True, verdict
        return
    assert verdict.kind is T, verdict
    assert "terminal event" in verdict.reason and "arrived but was never ended" in verdict.reason
    assert verdict.evidence["terminal_not_dispatched"] is True
    # cut inside the terminal event's line, the reason is the same
    line_cut = body[: -missing - 1]
    assert analyze_bytes(line_cut, dialect, end=end).verdict.kind is T


@pytest.mark.parametrize("end", [StreamEnd.FINISHED, StreamEnd.UPSTREAM_RESET])
def test_a_stream_cut_inside_a_delta_is_not_said_to_have_lost_its_terminal_event(end):
    """Half a content_block_delta's JSON, completed for the probe, is unreadable, not a terminal
    signal: the cut is an ordinary one."""
    body = anthropic_body(anthropic_events("t", "a", {"x": 1}))
    delta = body.index(b"event: content_block_delta")
    cut = body[: body.index(b"\n", body.index(b"data: ", delta)) - 5]  # inside the delta's data line
    verdict = analyze_bytes(cut, ANTHROPIC, end=end).verdict
    assert verdict.kind is T and "terminal" not in verdict.reason, verdict
    assert "terminal_not_dispatched" not in verdict.evidence


def test_a_bom_mid_stream_does_not_make_an_unended_line_a_terminal_event():
    """Only the stream's first bytes can be a BOM: "\ufeffdata: [DONE]" after the first event is
    a field named "\ufeffdata", ignored, so no terminal event arrived, dispatched or not."""
    body = openai_chat(["Hello"])
    before = body[: body.rfind(b"data: [DONE]")]
    verdict = analyze_bytes(before + b"\xef\xbb\xbfdata: [DONE]\n", CHAT).verdict
    assert verdict.kind is T and "terminal_not_dispatched" not in verdict.evidence, verdict


def test_crlf_body_cut_between_its_last_cr_and_lf_stays_complete():
    """A lone CR ends the line and the blank line (SSE rules): the event was dispatched."""
    body = openai_chat(["Hello"]).replace(b"\n", b"\r\n")
    assert body.endswith(b"\r\n\r\n")
    for dialect, crlf in ((CHAT, body), (Dialect.GEMINI, gemini_chunk("Hel") + gemini_chunk("lo", "STOP"))):
        assert analyze_bytes(crlf[:-1], dialect).verdict.kind is C
        assert analyze_bytes(crlf[:-2], dialect, end=StreamEnd.UPSTREAM_RESET).verdict.kind is T
    assert analyze_bytes(body[:-2], CHAT).verdict.kind is T  # google-genai reads the unended event, the openai SDK not


def test_anthropic_content_after_the_stop_reason_is_corrupt():
    """message_delta's stop_reason ends the message's content: a block delta after it contradicts it."""
    events = anthropic_events("think", "answer", {"city": "Paris"})
    delta = next(i for i, e in enumerate(events) if e["type"] == "message_delta")
    events.insert(delta + 1, {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": ""}})
    body = anthropic_body(events)
    verdict = analyze_bytes(body, ANTHROPIC).verdict
    assert_names_both(verdict, sse_events(body), delta, delta + 1)
    assert "message_delta (stop_reason tool_use)" in verdict.reason


def test_responses_delta_naming_its_item_only_by_id_after_the_item_closed_is_corrupt():
    body = openai_responses(["Hel", "lo"])
    late = {k: v for k, v in text_delta(" again").items() if k != "output_index"}
    verdict = analyze_bytes(responses_insert(body, "response.output_item.done", late), RESPONSES).verdict
    assert verdict.kind is X and "after output item 0 was closed by response.output_item.done" in verdict.reason, verdict


def test_responses_completed_event_whose_response_is_not_completed_is_not_complete():
    body = openai_responses(["Hi"])
    objects = [orjson.loads(e.data) for e in sse_events(body)]
    objects[-1]["response"]["status"] = "incomplete"
    verdict = analyze_bytes(b"".join(_sse(o["type"], o) for o in objects), RESPONSES).verdict
    assert verdict.kind.value == "unknown" and "incomplete" in verdict.reason, verdict


def test_anthropic_a_second_different_stop_reason_is_corrupt():
    events = anthropic_events("think", "answer", {"city": "Paris"})
    delta = next(i for i, e in enumerate(events) if e["type"] == "message_delta")
    events.insert(delta + 1, {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 40}})
    body = anthropic_body(events)
    assert_names_both(analyze_bytes(body, ANTHROPIC).verdict, sse_events(body), delta, delta + 1)


def test_responses_parts_only_the_finished_item_carries_are_in_the_turn():
    """No summary deltas: the reasoning summary and signature come with output_item.done; the SDK shows them."""
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    done = {**reasoning, "summary": [{"type": "summary_text", "text": "I thought."}], "encrypted_content": "sig-final"}
    events = [
        {"type": "response.created", "response": {"id": "r", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {"type": "response.completed", "response": {"id": "r", "status": "completed", "output": [done]}},
    ]
    body = b"".join(_sse(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events))
    analysis = analyze_bytes(body, RESPONSES)
    assert analysis.verdict.kind is C, analysis.verdict
    assert analysis.turn.thinking() == "I thought."
    assert [b.signature for b in analysis.turn.blocks] == ["sig-final"]


def test_anthropic_ping_after_message_stop_is_corrupt():
    events = anthropic_events("think", "answer", {"city": "Paris"}) + [{"type": "ping"}]
    body = anthropic_body(events)
    assert_names_both(analyze_bytes(body, ANTHROPIC).verdict, sse_events(body), len(events) - 2, len(events) - 1)


def test_converse_metadata_twice_is_corrupt():
    body = bedrock_converse(["Hi"], {"city": "Paris"})
    messages = frames(body)
    again = body + messages[-1].raw
    assert_names_both(analyze_bytes(again, Dialect.BEDROCK_CONVERSE).verdict, frames(again),
                      len(messages) - 1, len(messages))


@pytest.mark.parametrize("kind", ["response.output_text.done", "response.content_part.done", "response.output_item.added",
                                  "response.content_part.added"])
def test_responses_structural_event_twice_is_corrupt(kind):
    body = openai_responses(["Hel", "lo"])
    objects = [orjson.loads(e.data) for e in sse_events(body)]
    twice = responses_insert(body, kind, dict(next(o for o in objects if o["type"] == kind)))
    verdict = analyze_bytes(twice, RESPONSES).verdict
    assert verdict.kind is X, verdict


def test_chat_role_on_the_finish_chunk_starts_nothing():
    body = b"".join([
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hel"}),
        chat_chunk({"content": "lo"}),
        chat_chunk({"role": "assistant"}, "stop"),
        b"data: [DONE]\n\n",
    ])
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C and analysis.turn.text() == "Hello", analysis.verdict


def test_an_unknown_dialect_never_claims_a_terminal_event():
    verdict = analyze_bytes(b'data: {"a": 1}\n\ndata: {"b": 2}\n', Dialect.UNKNOWN).verdict
    assert verdict.kind is T and "terminal" not in verdict.reason, verdict


# -- anything after the end: events the dialect does not use are not "unknown, noted" there --------------


@pytest.mark.parametrize("late", [
    _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " more"}}),  # no type member
    _sse("content_block_delta_v2", {"type": "content_block_delta_v2", "index": 0}),
    b"event: message_start\ndata:\n\n",  # empty data
], ids=["no-type", "unknown-type", "empty-data"])
def test_anthropic_an_event_it_does_not_use_after_message_stop_is_corrupt(late):
    events = anthropic_events("think", "answer", {"city": "Paris"})
    body = anthropic_body(events) + late
    inside = anthropic_body(events[:-2]) + late + anthropic_body(events[-2:])
    assert analyze_bytes(inside, ANTHROPIC).verdict.kind is C  # while the message is open: noted only
    stop = len(events) - 1
    assert_names_both(analyze_bytes(body, ANTHROPIC).verdict, sse_events(body), stop, stop + 1)


def invoke_frame(inner: dict, event_type: str = "chunk") -> bytes:
    payload = json.dumps({"bytes": base64.b64encode(json.dumps(inner).encode()).decode()}).encode()
    return encode_message({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
                          payload)


@pytest.mark.parametrize("late, inside_kind", [
    (invoke_frame({"type": "foo"}), C),
    # no family has this shape: inside the answer it leaves unsaid what it carried
    (invoke_frame({"delta": "x"}), VerdictKind.UNKNOWN),
    (invoke_frame({"type": "message_stop"}, event_type="trace"), C),  # not a chunk
], ids=["unknown-type", "unknown-family", "not-a-chunk"])
def test_bedrock_invoke_a_frame_it_does_not_use_after_the_end_is_corrupt(late, inside_kind):
    events = anthropic_events("think", "answer", {"city": "Paris"})
    body = invoke_body(events)
    inside = invoke_body(events[:-2]) + late + invoke_body(events[-2:])
    assert analyze_bytes(inside, Dialect.BEDROCK_INVOKE).verdict.kind is inside_kind
    spliced = body + late
    assert_names_both(analyze_bytes(spliced, Dialect.BEDROCK_INVOKE).verdict, frames(spliced),
                      len(events) - 1, len(events))


def converse_frame(kind: str, payload: dict) -> bytes:
    return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                          json.dumps(payload).encode())


def test_converse_an_event_type_it_does_not_use_after_metadata_is_corrupt():
    body = bedrock_converse(["Hi"], {"city": "Paris"})
    messages = frames(body)
    late = converse_frame("contentBlockDeltaV2", {"contentBlockIndex": 0, "delta": {"text": "late"}})
    spliced = body + late
    stop = len(messages) - 2  # messageStop closed the message; metadata came after it, as it should
    verdict = analyze_bytes(spliced, Dialect.BEDROCK_CONVERSE).verdict
    assert verdict.kind is X and (verdict.seq, verdict.offset) == (len(messages), len(body)), verdict
    assert "after the message was closed by messageStop" in verdict.reason
    # between messageStop and metadata the same frame is only noted: the message's end is not all in
    between = body[: messages[stop].end] + late + body[messages[stop].end:]
    assert analyze_bytes(between, Dialect.BEDROCK_CONVERSE).verdict.kind is C


def test_converse_a_retry_appended_to_an_answer_cut_before_its_metadata_is_a_splice():
    """The first answer lost its metadata (usage) to a cut, and a whole retry was stitched after it."""
    body = bedrock_converse(["Hel", "lo"], {"city": "Paris"})
    messages = frames(body)
    cut = messages[-1].start  # just before metadata
    stitched = body[:cut] + body
    verdict = analyze_bytes(stitched, Dialect.BEDROCK_CONVERSE).verdict
    assert verdict.kind is X and "before the metadata (usage) of message 1" in verdict.reason, verdict
    assert (verdict.seq, verdict.offset) == (len(messages) - 1, cut)  # the retry's messageStart
    assert analyze_bytes(body + body, Dialect.BEDROCK_CONVERSE).verdict.kind is C  # both whole: back to back


def test_nova_on_invoke_a_retry_appended_to_an_answer_cut_before_its_metadata_is_a_splice():
    nova = [{"messageStart": {"role": "assistant"}},
            {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "Hi"}}},
            {"contentBlockStop": {"contentBlockIndex": 0}},
            {"messageStop": {"stopReason": "end_turn"}},
            {"metadata": {"usage": {"inputTokens": 3, "outputTokens": 1}}}]
    whole = b"".join(map(invoke_frame, nova))
    assert analyze_bytes(whole, Dialect.BEDROCK_INVOKE).verdict.kind is C
    twice = analyze_bytes(whole + whole, Dialect.BEDROCK_INVOKE).verdict  # one invocation answers once
    assert twice.kind is X and "stitched" in twice.reason, twice
    cut = b"".join(map(invoke_frame, nova[:-1]))
    verdict = analyze_bytes(cut + whole, Dialect.BEDROCK_INVOKE).verdict
    assert verdict.kind is X and "spliced stream" in verdict.reason, verdict


def test_anthropic_a_stop_reason_in_message_start_that_message_delta_contradicts_is_corrupt():
    events = anthropic_events("think", "answer", {"city": "Paris"})
    events[0]["message"]["stop_reason"] = "max_tokens"
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] != "max_tokens"
    verdict = analyze_bytes(anthropic_body(events), ANTHROPIC).verdict
    assert verdict.kind is X and "contradicts message_start's stop_reason max_tokens" in verdict.reason, verdict
    events[0]["message"]["stop_reason"] = delta["delta"]["stop_reason"]  # the same reason twice: no contradiction
    assert analyze_bytes(anthropic_body(events), ANTHROPIC).verdict.kind is C


def test_gemini_a_blocked_prompt_after_an_answer_is_corrupt():
    blocked = b"data: " + orjson.dumps({"promptFeedback": {"blockReason": "SAFETY"}}) + b"\r\n\r\n"
    answered = gemini_chunk("Hel") + gemini_chunk("lo", "STOP")
    assert analyze_bytes(answered, Dialect.GEMINI).verdict.kind is C
    verdict = analyze_bytes(answered + blocked, Dialect.GEMINI).verdict
    assert verdict.kind is X and "blockReason SAFETY" in verdict.reason, verdict
    # a blocked prompt whose candidate carries no content is filtered, whatever its finishReason says
    empty = b"data: " + orjson.dumps({"candidates": [{"index": 0, "finishReason": "STOP"}]}) + b"\r\n\r\n"
    assert analyze_bytes(blocked + empty, Dialect.GEMINI).verdict.kind.value == "filtered"


# -- a tool stop without a tool call ----------------------------------------------------------


def _without_tool_events(dialect: Dialect) -> bytes:
    if dialect is Dialect.OPENAI_CHAT:
        return openai_chat(["Let me check."], finish="tool_calls")
    if dialect is Dialect.ANTHROPIC:
        events = [e for e in anthropic_events("t", "Let me check.", {"city": "Paris"})
                  if e.get("index") != 2]  # the tool_use block's start, deltas and stop
        return b"".join(_sse(e["type"], e) for e in events)
    body = bedrock_converse(["Let me check."], {"city": "Paris"})
    decoder = EventStreamDecoder()
    return b"".join(m.raw for m in decoder.feed(body) if json.loads(m.payload).get("contentBlockIndex") != 1)


@pytest.mark.parametrize("dialect", [Dialect.OPENAI_CHAT, Dialect.ANTHROPIC, Dialect.BEDROCK_CONVERSE])
def test_a_tool_stop_without_any_tool_call_is_corrupt(dialect: Dialect) -> None:
    """The stop reason says the model called a tool and none arrived: its events were lost, or the
    stop belongs to another answer. The SDKs pass it on, and the app has no call to run."""
    body = _without_tool_events(dialect)
    analysis = analyze_bytes(body, dialect)
    assert not analysis.turn.tool_calls()
    assert analysis.verdict.kind is X and "no tool call arrived" in analysis.verdict.reason, analysis.verdict
