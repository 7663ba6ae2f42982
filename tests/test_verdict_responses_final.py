"""Responses API: a final response whose output list leaves out an item the stream delivered is corrupt.

The openai SDK's ``get_final_response()`` hands the app the terminal event's ``response.output``
as sent; only a null or absent ``output`` is rebuilt from the ``output_item.done`` items
(openai/lib/streaming/responses/_responses.py). So an explicit list that lacks a streamed item
contradicts the deltas (provider-streams.md §2.6); the ChatGPT Codex backend sends ``output: []``.
"""

from __future__ import annotations

import json

import orjson
import pytest
from provider_streams import chunk_lines, frame_responses, vercel
from conftest import FIXTURES

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

R = Dialect.OPENAI_RESPONSES
TERMINALS = ("response.completed", "response.incomplete")

MESSAGE = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]}
CALL = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
        "name": "get_weather", "arguments": '{"city":"Paris"}'}
EXTRA = {"id": "msg_2", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "More.", "annotations": []}]}


def events(terminal: dict) -> list[dict]:
    """A message with text deltas, then a function call with argument deltas, then ``terminal``."""
    started = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt", "output": []}
    part = MESSAGE["content"][0]
    out = [
        {"type": "response.created", "response": started},
        {"type": "response.output_item.added", "output_index": 0, "item": {**MESSAGE, "content": [], "status": "in_progress"}},
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 0,
         "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Let me "},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "look."},
        {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "text": "Let me look."},
        {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE},
        {"type": "response.output_item.added", "output_index": 1, "item": {**CALL, "arguments": "", "status": "in_progress"}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": '{"city":'},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": '"Paris"}'},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 1, "arguments": CALL["arguments"]},
        {"type": "response.output_item.done", "output_index": 1, "item": CALL},
        terminal,
    ]
    return [{**event, "sequence_number": n} for n, event in enumerate(out)]


def body(kind: str = "response.completed", **response) -> bytes:
    final = {"id": "resp_1", "object": "response", "model": "gpt",
             "status": "completed" if kind == "response.completed" else "incomplete", **response}
    if kind == "response.incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    return frame_responses([json.dumps(e).encode() for e in events({"type": kind, "response": final})])


def test_an_empty_final_output_after_streamed_items_is_corrupt():
    verdict = analyze_bytes(body(output=[]), R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == "the deltas disagree with the final response: it leaves out output item 0 (message msg_1)"
    assert verdict.seq == 13 and verdict.evidence["output_index"] == 0 and verdict.evidence["final_items"] == 0


def test_a_final_output_without_the_streamed_call_is_corrupt():
    verdict = analyze_bytes(body(output=[MESSAGE]), R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "leaves out output item 1 (function_call fc_1)" in verdict.reason


def test_an_incomplete_response_that_leaves_out_an_item_is_corrupt():
    verdict = analyze_bytes(body("response.incomplete", output=[CALL]), R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "leaves out output item 0 (message msg_1)" in verdict.reason
    assert analyze_bytes(body("response.incomplete", output=[MESSAGE, CALL]), R).verdict.kind is VerdictKind.STOPPED_BY_LIMIT


@pytest.mark.parametrize("output", [[MESSAGE, CALL], [MESSAGE, CALL, EXTRA]], ids=["equal", "superset"])
def test_a_final_output_holding_every_streamed_item_stays_complete(output):
    analysis = analyze_bytes(body(output=output), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason == "tool_use"


@pytest.mark.parametrize("response", [{"output": None}, {}], ids=["null", "absent"])
def test_a_null_or_absent_output_is_rebuilt_by_the_sdk_and_stays_complete(response):
    analysis = analyze_bytes(body(**response), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [b.text or b.arguments_raw for b in analysis.turn.blocks] == ["Let me look.", CALL["arguments"]]


def copilot_lines() -> list[bytes]:
    path = vercel("openai", "responses", "github-copilot-id-rotation.1.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return chunk_lines(path)


def with_final_output(lines: list[bytes], edit) -> list[bytes]:
    """``lines`` with the terminal event's output replaced by ``edit(output)``."""
    out = []
    for line in lines:
        event = orjson.loads(line)
        if event.get("type") in TERMINALS:
            event["response"]["output"] = edit(event["response"]["output"])
            line = orjson.dumps(event)
        out.append(line)
    return out


def test_rotated_ids_are_matched_by_position_and_type():
    """GitHub Copilot gives every item new ids in the final response: position and type still find them."""
    lines = copilot_lines()
    assert analyze_bytes(frame_responses(lines), R).verdict.kind is VerdictKind.COMPLETE
    dropped = analyze_bytes(frame_responses(with_final_output(lines, lambda output: output[:1])), R).verdict
    assert dropped.kind is VerdictKind.CORRUPT, dropped
    assert "leaves out output item 1 (message)" in dropped.reason
    swapped = analyze_bytes(frame_responses(with_final_output(lines, lambda output: output[::-1])), R).verdict
    assert swapped.kind is VerdictKind.CORRUPT, swapped


def responses_captures() -> list[str]:
    names = []
    for path in sorted(FIXTURES.glob("**/*")):
        if path.suffix == ".sse" or path.name.endswith(".chunks.txt"):
            if b'"response.completed"' in path.read_bytes():
                names.append(str(path.relative_to(FIXTURES)))
    return names


@pytest.mark.parametrize("name", responses_captures())
def test_every_capture_missing_its_last_item_is_corrupt(name):
    """On every capture (real and vendor-written), the final response without its last streamed item contradicts the stream."""
    path = FIXTURES / name
    if path.suffix == ".sse":
        lines = [line[6:] for line in path.read_bytes().split(b"\n") if line.startswith(b"data: {")]
    else:
        lines = chunk_lines(path)
    terminal = next(i for i, line in enumerate(lines) if orjson.loads(line).get("type") in TERMINALS)
    lines = lines[: terminal + 1]  # the first response of a body that holds several
    intact = analyze_bytes(frame_responses(lines), R).verdict
    cut = analyze_bytes(frame_responses(with_final_output(lines, lambda output: output[:-1])), R).verdict
    if intact.kind is VerdictKind.CORRUPT:
        assert cut.reason == intact.reason  # the earlier corruption still decides
        return
    assert cut.kind is VerdictKind.CORRUPT, cut
    assert "the deltas disagree with the final response: it leaves out output item" in cut.reason


def shifted(events_: list[dict], by: int) -> list[dict]:
    """The events with every output_index moved up by ``by``: a gap before the first item, as a
    provider's empty added event leaves (the SDK allows gaps)."""
    return [{**e, "output_index": e["output_index"] + by} if "output_index" in e else e for e in events_]


def test_final_items_are_found_by_id_not_by_their_place_in_the_list():
    """Items streamed at output indexes 2 and 3 are the final list's items 0 and 1: matched by
    place, both were added again, and the turn was complete with its text and call twice."""
    final = [MESSAGE, CALL]
    stream = events({"type": "response.completed", "response": {"id": "resp_1", "object": "response", "model": "gpt",
                                                                  "status": "completed", "output": final}})
    analysis = analyze_bytes(frame_responses([json.dumps(e).encode() for e in shifted(stream, 2)]), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "Let me look." and len(analysis.turn.tool_calls()) == 1, analysis.turn
    assert not analysis.turn.notes
    # an item the stream never announced still comes from the final list, once
    stream[-1]["response"]["output"] = [EXTRA, *final]
    analysis = analyze_bytes(frame_responses([json.dumps(e).encode() for e in shifted(stream, 2)]), R)
    text = analysis.turn.text()
    assert text.count("More.") == text.count("Let me look.") == 1 and len(analysis.turn.tool_calls()) == 1, analysis.turn


def test_a_final_list_in_another_order_than_the_stream_is_corrupt():
    """The SDK hands the app the final list (``get_final_response().output``, and output_text joins its
    messages in that order): items listed in another order than they streamed are an answer the stream did not show."""
    stream = events({"type": "response.completed", "response": {"id": "resp_1", "object": "response", "model": "gpt",
                                                                  "status": "completed", "output": [CALL, MESSAGE]}})
    verdict = analyze_bytes(frame_responses([json.dumps(e).encode() for e in shifted(stream, 2)]), R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "it lists output item 2 (place 1) after output item 3 (place 0), in another order than the stream" in verdict.reason


def test_a_final_item_of_another_type_than_streamed_in_its_place_is_corrupt():
    """A message that streamed as text and that the final response lists, by the same id, as a function
    call: the app runs a tool where the stream showed an answer."""
    as_call = {"type": "function_call", "id": MESSAGE["id"], "call_id": "call_9", "name": "delete_everything",
               "arguments": "{}", "status": "completed"}
    stream = events({"type": "response.completed", "response": {"id": "resp_1", "object": "response", "model": "gpt",
                                                                  "status": "completed", "output": [as_call, CALL]}})
    verdict = analyze_bytes(frame_responses([json.dumps(e).encode() for e in stream]), R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "streamed as a message and the final response gives it as a function_call" in verdict.reason


@pytest.mark.parametrize("said", [{"error": {"code": "server_error", "message": "failed mid-answer"}},
                                  {"incomplete_details": {"reason": "max_output_tokens"}}])
def test_a_completed_response_that_holds_an_error_or_a_cut_is_not_complete(said):
    """The SDK's final response hands the app the error or the cut; the event says it finished."""
    verdict = analyze_bytes(body(output=[MESSAGE, CALL], **said), R).verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict
    assert f"completed with {next(iter(said))}" in verdict.reason
    assert analyze_bytes(body(output=[MESSAGE, CALL], error=None, incomplete_details=None), R).verdict.kind is VerdictKind.COMPLETE


def test_an_added_event_without_an_item_is_skipped_as_the_sdk_skips_it():
    """Some compatible providers send an empty added event: a gap in the output indexes, no item."""
    stream = events({"type": "response.completed", "response": {"id": "resp_1", "object": "response", "model": "gpt",
                                                                "status": "completed", "output": [MESSAGE, CALL]}})
    empty = {"type": "response.output_item.added", "output_index": 0, "item": None}
    gapped = [{**e, "output_index": e["output_index"] + 1} if "output_index" in e else e for e in stream]
    for events_ in ([stream[0], empty, *stream[1:]], [stream[0], empty, *gapped[1:]]):
        numbered = [{**e, "sequence_number": n} for n, e in enumerate(events_)]
        analysis = analyze_bytes(frame_responses([json.dumps(e).encode() for e in numbered]), R)
        assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
        assert any("without an item" in note for note in analysis.turn.notes)
        assert analysis.turn.text() == "Let me look."


def test_a_part_only_the_final_response_holds_after_its_items_parts_were_streamed_is_corrupt():
    """The SDK's final response shows it, an app reading the events never saw it: the two copies
    disagree. A server that streams no part events for the item still gets its parts from it."""
    more = {"type": "output_text", "text": " More.", "annotations": []}
    longer = {**MESSAGE, "content": [*MESSAGE["content"], more]}
    verdict = analyze_bytes(body(output=[longer, CALL]), R).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "output item 0 part content 1 came only with the final response, though the item's other content parts" in verdict.reason
    partless = [e for e in events({"type": "response.completed", "response": {
        "id": "resp_1", "object": "response", "model": "gpt", "status": "completed", "output": [longer, CALL]}})
        if not e["type"].startswith(("response.content_part", "response.output_text"))]
    analysis = analyze_bytes(frame_responses([json.dumps({**e, "sequence_number": n}).encode()
                                              for n, e in enumerate(partless)]), R)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "Let me look. More."
