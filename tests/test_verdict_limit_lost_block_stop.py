"""A limit cuts only the last block: an earlier block left open lost its stop, corrupt.

``max_tokens`` / ``model_context_window_exceeded`` stop the model in the block it is generating,
the last one started, which may then stay open. A block that never got its stop although a later
block started after it lost a frame, and the limit does not explain that: the verdict is corrupt,
naming both blocks, as it is after ``tool_use`` or ``end_turn``. The finished tool call whose stop
was lost must not be called cut by the limit either. ConverseStream (and Nova's chunks on
InvokeModel) and Anthropic Messages (SSE, and Claude's chunks on InvokeModel) share the rule.
"""

from __future__ import annotations

import base64
import json
import struct

import pytest
from conftest import shared_path
from test_providers_anthropic import START, end, sse, text_block, tool_block
from test_providers_bedrock import chunk_frame, converse_frame

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

LIMITS = ["max_tokens", "model_context_window_exceeded"]


def assert_lost_stop(analysis, block: int, later: int) -> None:
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert f"block {block} never stopped, but block {later} started after it" in verdict.reason, verdict
    assert (verdict.evidence["block"], verdict.evidence["started_after"]) == (block, later), verdict
    assert "cut_tool_calls" not in verdict.evidence, verdict
    for tool in analysis.turn.tool_calls():  # no finished call is blamed on the limit
        assert "cut by" not in (tool.arguments_error or ""), tool


# -- ConverseStream, constructed --------------------------------------------------------------------
def converse(stop_reason: str, stop_text: bool = True, stop_tool: bool = True) -> bytes:
    frames = [converse_frame("messageStart", {"role": "assistant"}),
              converse_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Let me check."}})]
    if stop_text:
        frames.append(converse_frame("contentBlockStop", {"contentBlockIndex": 0}))
    frames += [converse_frame("contentBlockStart", {"contentBlockIndex": 1,
                                                    "start": {"toolUse": {"toolUseId": "t1", "name": "get_weather"}}}),
               converse_frame("contentBlockDelta", {"contentBlockIndex": 1,
                                                    "delta": {"toolUse": {"input": '{"city": "Pa'}}})]
    if stop_tool:
        frames += [converse_frame("contentBlockDelta", {"contentBlockIndex": 1,
                                                        "delta": {"toolUse": {"input": 'ris"}'}}}),
                   converse_frame("contentBlockStop", {"contentBlockIndex": 1})]
    frames += [converse_frame("messageStop", {"stopReason": stop_reason}),
               converse_frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}})]
    return b"".join(frames)


@pytest.mark.parametrize("stop_reason", LIMITS)
def test_converse_earlier_block_left_open_at_a_limit_is_corrupt(stop_reason: str) -> None:
    analysis = analyze_bytes(converse(stop_reason, stop_text=False), Dialect.BEDROCK_CONVERSE)
    assert_lost_stop(analysis, 0, 1)
    assert analysis.verdict.seq == 6  # messageStop, where the open block shows


@pytest.mark.parametrize("stop_reason", LIMITS)
def test_converse_last_block_cut_by_a_limit_stays_stopped_by_limit(stop_reason: str) -> None:
    analysis = analyze_bytes(converse(stop_reason, stop_tool=False), Dialect.BEDROCK_CONVERSE)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.STOPPED_BY_LIMIT and verdict.evidence["cut_tool_calls"] == [[0, 1]], verdict
    tool = analysis.turn.tool_calls()[0]
    assert tool.arguments_raw == '{"city": "Pa' and stop_reason in tool.arguments_error


# -- Anthropic SSE, constructed ----------------------------------------------------------------------
def anthropic(stop_reason: str, lose: int | None) -> bytes:
    blocks = [text_block(0, "Let me check."), tool_block(1, '{"location": ', '"Paris"}'), text_block(2, "Then")]
    events = [START]
    for index, block in enumerate(blocks):
        events += block[:-1] if index == lose else block
    return sse(*events, *end(stop_reason))


@pytest.mark.parametrize("stop_reason", LIMITS)
@pytest.mark.parametrize("lose, later", [(0, 1), (1, 2)])
def test_anthropic_earlier_block_left_open_at_a_limit_is_corrupt(stop_reason: str, lose: int, later: int) -> None:
    assert_lost_stop(analyze_bytes(anthropic(stop_reason, lose), Dialect.ANTHROPIC), lose, later)


@pytest.mark.parametrize("stop_reason", LIMITS)
def test_anthropic_last_block_left_open_at_a_limit_stays_stopped_by_limit(stop_reason: str) -> None:
    analysis = analyze_bytes(anthropic(stop_reason, 2), Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.STOPPED_BY_LIMIT, analysis.verdict
    assert analysis.turn.tool_calls()[0].arguments == {"location": "Paris"}


@pytest.mark.parametrize("stop_tool", [False, True], ids=["left-open", "stopped-with-its-json-cut"])
def test_anthropic_pause_turn_cuts_no_block(stop_tool: bool) -> None:
    """pause_turn pauses a server-tool turn between blocks (the caller resends the content as it is):
    unlike max_tokens it explains no block left open and no tool JSON cut short, so either is corrupt."""
    search = tool_block(1, '{"query": "weather in Par', name="web_search")
    body = sse(START, *text_block(0, "Let me search."), *(search if stop_tool else search[:-1]), *end("pause_turn"))
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "cut_tool_calls" not in verdict.evidence, verdict
    assert ("invalid argument JSON" if stop_tool else "started but never stopped") in verdict.reason, verdict
    whole = sse(START, *text_block(0, "Let me search."), *tool_block(1, '{"query": "weather"}', name="web_search"),
                *end("pause_turn"))
    assert analyze_bytes(whole, Dialect.ANTHROPIC).verdict.kind is VerdictKind.STOPPED_BY_LIMIT  # paused, whole


# -- real captures (Bedrock InvokeModel), mutated ---------------------------------------------------
def chunks(path) -> list[dict]:
    """The decoded chunk events of an InvokeModel body, one per frame."""
    body, events, at = path.read_bytes(), [], 0
    while at < len(body):
        total, headers = struct.unpack(">II", body[at:at + 8])
        payload = body[at + 12 + headers:at + total - 4]
        events.append(json.loads(base64.b64decode(json.loads(payload)["bytes"])))
        at += total
    return events


def invoke(events: list[dict], skip: int | None = None) -> bytes:
    return b"".join(chunk_frame(event) for i, event in enumerate(events) if i != skip)


def claude_tool_calls_at_limit(stop_reason: str) -> list[dict]:
    path = shared_path("fixtures", "otel-contrib", "bodies", "invoke_stream_tool_call__anthropic.claude.0.bin")
    events = chunks(path)
    for event in events:
        if event.get("type") == "message_delta":
            event["delta"]["stop_reason"] = stop_reason
    return events


@pytest.mark.parametrize("stop_reason", LIMITS)
def test_claude_capture_with_a_finished_tool_call_losing_its_stop_is_corrupt(stop_reason: str) -> None:
    events = claude_tool_calls_at_limit(stop_reason)
    stops = [i for i, event in enumerate(events) if event.get("type") == "content_block_stop"]
    assert len(stops) == 3  # text, then two get_current_weather calls
    analysis = analyze_bytes(invoke(events, stops[1]), Dialect.BEDROCK_INVOKE)
    assert_lost_stop(analysis, 1, 2)


@pytest.mark.parametrize("stop_reason", LIMITS)
def test_claude_capture_with_its_last_block_left_open_stays_stopped_by_limit(stop_reason: str) -> None:
    events = claude_tool_calls_at_limit(stop_reason)
    stops = [i for i, event in enumerate(events) if event.get("type") == "content_block_stop"]
    analysis = analyze_bytes(invoke(events, stops[-1]), Dialect.BEDROCK_INVOKE)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.STOPPED_BY_LIMIT and verdict.evidence["cut_tool_calls"] == [[0, 2]], verdict
    first, last = analysis.turn.tool_calls()
    assert first.arguments == {"location": "Seattle"} and first.arguments_error is None
    assert stop_reason in last.arguments_error


def test_claude_capture_paused_with_its_last_block_left_open_is_corrupt() -> None:
    """pause_turn is a limit's verdict, but it cuts no block: the last block left open lost its stop."""
    events = claude_tool_calls_at_limit("pause_turn")
    stops = [i for i, event in enumerate(events) if event.get("type") == "content_block_stop"]
    assert analyze_bytes(invoke(events), Dialect.BEDROCK_INVOKE).verdict.kind is VerdictKind.STOPPED_BY_LIMIT
    verdict = analyze_bytes(invoke(events, stops[-1]), Dialect.BEDROCK_INVOKE).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "started but never stopped" in verdict.reason, verdict


def test_nova_capture_losing_any_block_stop_but_the_last_is_corrupt() -> None:
    path = shared_path("fixtures", "otel-contrib", "bodies", "invoke_stream_with_content__amazon.nova.0.bin")
    events = chunks(path)
    assert analyze_bytes(invoke(events), Dialect.BEDROCK_INVOKE).verdict.kind is VerdictKind.STOPPED_BY_LIMIT
    stops = [i for i, event in enumerate(events) if "contentBlockStop" in event]
    assert len(stops) == 10 and events[-2] == {"messageStop": {"stopReason": "max_tokens"}}
    for block, skip in enumerate(stops[:-1]):
        assert_lost_stop(analyze_bytes(invoke(events, skip), Dialect.BEDROCK_INVOKE), block, block + 1)
    # the last block is the one a limit cuts: left open, still stopped_by_limit
    last = analyze_bytes(invoke(events, stops[-1]), Dialect.BEDROCK_INVOKE)
    assert last.verdict.kind is VerdictKind.STOPPED_BY_LIMIT, last.verdict


# -- a call closed with arguments that do not parse, and a block after it --------------------------
def anthropic_broken_call(then_text: bool) -> bytes:
    events = [START, *tool_block(0, '{"city": "Pa'), *(text_block(1, "Done.") if then_text else [])]
    return sse(*events, *end("max_tokens"))


def chat_broken_call(then_call: bool) -> bytes:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    def call(index: int, arguments: str) -> dict:
        return {"tool_calls": [{"index": index, "id": f"call_{index}", "type": "function",
                                "function": {"name": "f", "arguments": arguments}}]}

    calls = [chunk(call(0, '{"city": "Pa'))] + ([chunk(call(1, '{"city": "Lyon"}'))] if then_call else [])
    return chunk({"role": "assistant"}) + b"".join(calls) + chunk({}, "length") + b"data: [DONE]\n\n"


def responses_broken_call(then_message: bool) -> bytes:
    call = {"id": "fc_0", "type": "function_call", "status": "completed", "arguments": '{"city": "Pa', "call_id": "c0",
            "name": "f"}
    message = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}
    part = {"type": "output_text", "text": "", "annotations": []}
    events = [("response.created", {"response": {"id": "r", "object": "response", "status": "in_progress", "output": []}}),
              ("response.output_item.added", {"output_index": 0, "item": {**call, "status": "in_progress", "arguments": ""}}),
              ("response.function_call_arguments.delta", {"item_id": "fc_0", "output_index": 0, "delta": call["arguments"]}),
              ("response.function_call_arguments.done", {"item_id": "fc_0", "output_index": 0, "arguments": call["arguments"]}),
              ("response.output_item.done", {"output_index": 0, "item": call})]
    where = {"item_id": "msg_1", "output_index": 1, "content_index": 0}
    if then_message:
        events += [("response.output_item.added", {"output_index": 1, "item": {**message, "status": "in_progress", "content": []}}),
                   ("response.content_part.added", {**where, "part": part}),
                   ("response.output_text.delta", {**where, "delta": "Done."}),
                   ("response.output_text.done", {**where, "text": "Done."}),
                   ("response.content_part.done", {**where, "part": {**part, "text": "Done."}}),
                   ("response.output_item.done", {"output_index": 1, "item": message})]
    output = [call, message] if then_message else [call]
    events.append(("response.incomplete", {"response": {"id": "r", "object": "response", "status": "incomplete", "output": output,
                                                        "incomplete_details": {"reason": "max_output_tokens"}}}))
    return b"".join(f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': n, **fields})}\n\n".encode()
                    for n, (kind, fields) in enumerate(events))


@pytest.mark.parametrize("dialect, build", [(Dialect.ANTHROPIC, anthropic_broken_call), (Dialect.OPENAI_CHAT, chat_broken_call),
                                            (Dialect.OPENAI_RESPONSES, responses_broken_call)],
                         ids=["anthropic", "chat", "responses"])
def test_a_call_closed_broken_before_another_block_was_not_cut_by_the_limit(dialect, build) -> None:
    """The limit cut the block being generated, the last: a call before it that is closed with
    arguments that do not parse was damaged, not cut."""
    last = analyze_bytes(build(False), dialect).verdict
    assert last.kind is VerdictKind.STOPPED_BY_LIMIT and last.evidence["cut_tool_calls"] == [[0, 0]], last
    for size in (None, 1, 7):
        verdict = analyze_bytes(build(True), dialect, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.CORRUPT, (size, verdict)
        assert "invalid argument JSON" in verdict.reason and "a limit cuts only the last block" in verdict.reason, verdict
