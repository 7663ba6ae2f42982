"""Per-message memory of back-to-back messages, analyze_bytes' memory, show's event count, and one
definition of first content (TTFT) across dialects: a tool call counts as it opens."""

from __future__ import annotations

import base64
import gc
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from streamtap.providers import Dialect, StreamSession, VerdictKind, analyze_bytes
from streamtap.providers.session import MAX_BLOCKS
from streamtap.recording import RecordingWriter
from streamtap.wire import encode_message

from provider_streams import anthropic_with_blocks

STREAMTAP = Path(sys.executable).with_name("streamtap")


def _sse(event: str | None, data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


def _anthropic(event: dict) -> bytes:
    return _sse(event["type"], event)


def _frame(kind: str, payload: dict) -> bytes:
    return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                          json.dumps({**payload, "p": "xy"}).encode())


# -- back-to-back messages ------------------------------------------------------------------------

def _anthropic_message(number: int, stop_reason: str) -> list[bytes]:
    message = {"id": f"msg_{number}", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
               "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    return [
        _anthropic({"type": "message_start", "message": message}),
        _anthropic({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 2}}),
        _anthropic({"type": "message_stop"}),
    ]


def _converse_message(number: int, stop_reason: str) -> list[bytes]:
    return [
        _frame("messageStart", {"role": "assistant"}),
        _frame("messageStop", {"stopReason": stop_reason}),
        _frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}}),
    ]


MESSAGES = {Dialect.ANTHROPIC: _anthropic_message, Dialect.BEDROCK_CONVERSE: _converse_message}
COMPLETE_STOP = {Dialect.ANTHROPIC: "end_turn", Dialect.BEDROCK_CONVERSE: "end_turn"}


def _retained_after(dialect: Dialect, count: int) -> int:
    """Bytes a session still holds after ``count`` complete messages back to back (not yet closed)."""
    message = MESSAGES[dialect]
    gc.collect()
    tracemalloc.start()
    try:
        session = StreamSession(dialect, keep_arrivals=False)
        before = tracemalloc.get_traced_memory()[0]
        for number in range(count):
            session.feed(b"".join(message(number, COMPLETE_STOP[dialect])))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert session.close().verdict.kind is VerdictKind.COMPLETE
    return held


@pytest.mark.parametrize("dialect", list(MESSAGES))
def test_memory_does_not_grow_with_the_number_of_back_to_back_messages(dialect):
    few, many = _retained_after(dialect, 500), _retained_after(dialect, 10_500)
    # one tuple per earlier message grew about 1 MiB over the 10,000 more; the state is per body
    assert many - few < 200 * 1024, (few, many)


@pytest.mark.parametrize("dialect", list(MESSAGES))
def test_the_first_earlier_message_that_did_not_finish_still_decides(dialect):
    message, done = MESSAGES[dialect], COMPLETE_STOP[dialect]
    stops = [done] * 300 + ["max_tokens"] + [done] * 300 + ["refusal"] + [done] * 300 + ["max_tokens", done]
    body = b"".join(b"".join(message(number, stop)) for number, stop in enumerate(stops))
    analysis = analyze_bytes(body, dialect)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.STOPPED_BY_LIMIT, verdict
    assert "an earlier message in this stream ended with" in verdict.reason and "max_tokens" in verdict.reason
    assert verdict.seq == 301 * 3  # where the message after the first cut one started
    assert verdict.evidence["messages"] == len(stops)
    all_complete = b"".join(b"".join(message(number, done)) for number in range(400))
    assert analyze_bytes(all_complete, dialect).verdict.kind is VerdictKind.COMPLETE


# -- analyze_bytes ----------------------------------------------------------------------------------

def _many_frames(count: int) -> bytes:
    frames = [_frame("messageStart", {"role": "assistant"})]
    frames += [_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "a"}})] * count
    frames += [_frame("contentBlockStop", {"contentBlockIndex": 0}),
               _frame("messageStop", {"stopReason": "end_turn"}),
               _frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": count, "totalTokens": count + 1}})]
    return b"".join(frames)


def test_analyze_bytes_of_a_whole_body_holds_no_list_of_its_events():
    body = _many_frames(80_000)  # about 12 MiB
    analyze_bytes(body[:2000], Dialect.BEDROCK_CONVERSE)  # the dialect module imported outside the measure
    gc.collect()
    tracemalloc.start()
    try:
        analysis = analyze_bytes(body, Dialect.BEDROCK_CONVERSE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert analysis.verdict.kind is VerdictKind.COMPLETE and analysis.wire_events == 80_004
    assert analysis.turn.text() == "a" * 80_000
    # the body is the caller's; every event at once was several times its size
    assert peak < 4 * 2**20, (peak, len(body))


@pytest.mark.parametrize("chunk_size", [1, 7, 4096, 65_536, 10**9])
def test_analyze_bytes_gives_the_same_analysis_for_any_chunking(chunk_size):
    body = anthropic_with_blocks(40)[:-30]  # cut inside the last event: close() returns a tail
    whole = analyze_bytes(body, Dialect.ANTHROPIC)
    chunked = analyze_bytes(body, Dialect.ANTHROPIC, chunk_size=chunk_size)
    assert whole.verdict.to_dict() == chunked.verdict.to_dict()
    assert whole.turn.to_dict() == chunked.turn.to_dict()
    assert (whole.wire_events, whole.bytes, whole.events) == (chunked.wire_events, chunked.bytes, chunked.events)
    assert whole.events and whole.turn.timing.arrivals == []


# -- streamtap show's event count -------------------------------------------------------------------

def _show(path: Path) -> str:
    result = subprocess.run([str(STREAMTAP), "show", "--provider", "anthropic", "--width", "0", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[0]


def test_show_counts_every_event_of_a_stream_past_max_blocks(tmp_path):
    blocks = MAX_BLOCKS + 100
    body = anthropic_with_blocks(blocks)
    events = 1 + 3 * blocks + 2
    raw = tmp_path / "many.sse"
    raw.write_bytes(body)
    assert _show(raw).endswith(f"(raw body, sse, {len(body)} bytes, {events} events)"), _show(raw)

    # a recording: the header's count is the end line's `events`, as the proxy writes it
    recording = tmp_path / "many.jsonl"
    writer = RecordingWriter(recording)
    writer.header({"dialect": "anthropic", "wire": {"format": "sse", "content_encoding": None},
                   "request": {"method": "POST", "url": "https://api.anthropic.com/v1/messages", "headers": []},
                   "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]}})
    session = StreamSession(Dialect.ANTHROPIC, keep_arrivals=False)
    step, t_ms = 65_536, 100.0
    for i in range(0, len(body), step):
        writer.read(body[i : i + step], t_ms)
        for event in session.feed(body[i : i + step], t_ms / 1000):
            writer.frame(event, t_ms)
        t_ms += 10
    analysis = session.close()
    assert analysis.verdict.kind is VerdictKind.UNKNOWN and analysis.turn.events < events  # the assembly stopped
    turn = analysis.turn.to_dict()
    turn.get("timing", {}).pop("arrivals", None)
    writer.finish({"verdict": analysis.verdict.to_dict(), "turn": turn, "stream_end": "finished",
                   "events": analysis.wire_events})
    end = json.loads(recording.read_text().splitlines()[-1])
    assert end["events"] == events
    assert _show(recording).endswith(f"(recording, sse, {len(body)} bytes, {end['events']} events)")


# -- first content: a tool call counts as it opens --------------------------------------------------

OPENS, ARGUMENTS, ENDS = 1.0, 2.0, 2.5  # seconds: the tool call opens, its arguments come, the turn ends


def _anthropic_tool_turn(arguments: list[str], block_type: str = "tool_use") -> list[tuple[bytes, float]]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
               "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    events = [(_anthropic({"type": "message_start", "message": message}), 0.1),
              (_anthropic({"type": "content_block_start", "index": 0, "content_block":
                           {"type": block_type, "id": "toolu_1", "name": "get_weather", "input": {}}}), OPENS)]
    events += [(_anthropic({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": piece}}), ARGUMENTS)
               for piece in arguments]
    events += [(_anthropic({"type": "content_block_stop", "index": 0}), ENDS),
               (_anthropic({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                            "usage": {"output_tokens": 9}}), ENDS),
               (_anthropic({"type": "message_stop"}), ENDS)]
    return events


def _anthropic_server_tool_turn() -> list[tuple[bytes, float]]:
    """A server tool call (web search) opens, then its query, its result and the answer's text."""
    events = _anthropic_tool_turn(['{"query":', '"weather"}'], "server_tool_use")[:-2]
    result = {"type": "web_search_tool_result", "tool_use_id": "toolu_1", "content": []}
    text_start = {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}
    text = {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Sunny."}}
    events += [(_anthropic({"type": "content_block_start", "index": 1, "content_block": result}), ENDS),
               (_anthropic({"type": "content_block_stop", "index": 1}), ENDS),
               (_anthropic(text_start), ENDS),
               (_anthropic(text), ENDS),
               (_anthropic({"type": "content_block_stop", "index": 2}), ENDS),
               (_anthropic({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                            "usage": {"output_tokens": 9}}), ENDS),
               (_anthropic({"type": "message_stop"}), ENDS)]
    return events


def _bedrock_invoke_tool_turn(arguments: list[str]) -> list[tuple[bytes, float]]:
    """The Anthropic turn inside Bedrock InvokeModel's ``chunk`` frames."""
    out = []
    for event, t in _anthropic_tool_turn(arguments):
        data = json.loads(event.split(b"data: ", 1)[1])
        inner = base64.b64encode(json.dumps(data).encode()).decode()
        out.append((encode_message({":event-type": "chunk", ":content-type": "application/json",
                                    ":message-type": "event"}, json.dumps({"bytes": inner}).encode()), t))
    return out


def _converse_tool_turn(arguments: list[str]) -> list[tuple[bytes, float]]:
    events = [(_frame("messageStart", {"role": "assistant"}), 0.1),
              (_frame("contentBlockStart", {"contentBlockIndex": 0, "start": {"toolUse": {
                  "toolUseId": "tooluse_1", "name": "get_weather"}}}), OPENS)]
    events += [(_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": piece}}}),
                ARGUMENTS) for piece in arguments]
    events += [(_frame("contentBlockStop", {"contentBlockIndex": 0}), ENDS),
               (_frame("messageStop", {"stopReason": "tool_use"}), ENDS),
               (_frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 9, "totalTokens": 10}}), ENDS)]
    return events


def _chat_tool_turn(arguments: list[str]) -> list[tuple[bytes, float]]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-test"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return _sse(None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    events = [(chunk({"role": "assistant", "content": None}), 0.1), (chunk({"tool_calls": [call]}), OPENS)]
    events += [(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), ARGUMENTS)
               for piece in arguments]
    events += [(chunk({}, "tool_calls"), ENDS), (b"data: [DONE]\n\n", ENDS)]
    return events


TOOL_TURNS = {
    Dialect.ANTHROPIC: _anthropic_tool_turn,
    Dialect.BEDROCK_INVOKE: _bedrock_invoke_tool_turn,
    Dialect.BEDROCK_CONVERSE: _converse_tool_turn,
    Dialect.OPENAI_CHAT: _chat_tool_turn,
}


def _fed(dialect: Dialect, events: list[tuple[bytes, float]]):
    session = StreamSession(dialect)
    for data, t in events:
        session.feed(data, t)
    return session.close()


@pytest.mark.parametrize("dialect", list(TOOL_TURNS))
def test_a_tool_call_is_first_content_when_it_opens_in_every_dialect(dialect):
    analysis = _fed(dialect, TOOL_TURNS[dialect](['{"city":', '"Paris"}']))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.tool_calls()[0].arguments == {"city": "Paris"}
    assert analysis.turn.timing.first_content == OPENS


# an empty delta after the call opened, and no delta at all (a chat call opens with its arguments field)
EMPTY_INPUTS = [pytest.param(dialect, [""], id=f"{dialect}-empty-delta") for dialect in TOOL_TURNS] + \
    [pytest.param(dialect, [], id=f"{dialect}-no-delta") for dialect in TOOL_TURNS if dialect is not Dialect.OPENAI_CHAT]


@pytest.mark.parametrize(("dialect", "arguments"), EMPTY_INPUTS)
def test_a_tool_call_with_empty_input_has_a_ttft(dialect, arguments):
    analysis = _fed(dialect, TOOL_TURNS[dialect](arguments))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.tool_calls()[0].arguments == {}
    assert analysis.turn.timing.first_content == OPENS


def test_an_anthropic_server_tool_call_is_first_content_when_it_opens():
    analysis = _fed(Dialect.ANTHROPIC, _anthropic_server_tool_turn())
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "Sunny."
    assert analysis.turn.timing.first_content == OPENS


def test_an_empty_text_block_is_still_not_first_content():
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
               "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    events = [(_anthropic({"type": "message_start", "message": message}), 0.1),
              (_anthropic({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
               OPENS),
              (_anthropic({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
               ARGUMENTS),
              (_anthropic({"type": "content_block_stop", "index": 0}), ENDS),
              (_anthropic({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 1}}), ENDS),
              (_anthropic({"type": "message_stop"}), ENDS)]
    assert _fed(Dialect.ANTHROPIC, events).turn.timing.first_content == ARGUMENTS
