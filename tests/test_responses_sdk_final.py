"""Responses streams judged against what the real openai SDK hands the app (``responses.stream(...)``,
``get_final_response()``): the turn equals that, or the verdict says why not.

- A final ``output`` that lists one item twice (the same message, or one call under one ``call_id``):
  the SDK hands the app both copies, the text twice or a call it runs twice: corrupt.
- A finished part typed ``refusal`` without a ``refusal`` string (null, or the text under ``text``) is
  still a refusal to the SDK, whose ``output_text`` is then empty: against a streamed output_text, corrupt.
- A part (or a call's arguments) that a ``.done`` event or the finished item gave as empty, then given
  other text by a later one: the two disagree, as a part whose deltas grew other text does: corrupt. A
  part no event gave whole before (a server that sends only the finished item) still takes its text.
- An event without ``sequence_number`` among numbered ones: the SDK reads it as any other, so nothing
  is lost by it; the numbers count it, and only a gap wider than such events is loss.
"""

from __future__ import annotations

import copy

import httpx2
import openai
import orjson
import pytest

from streamtap.providers import BlockKind, Dialect, VerdictKind, analyze_bytes

R = Dialect.OPENAI_RESPONSES
MID = "msg_1"
CALL = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "get_weather",
        "arguments": '{"city":"Paris"}'}


def response(status: str = "in_progress", output: list | None = None) -> dict:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "gpt-4o",
            "output": output or [], "error": None, "incomplete_details": None, "usage": None}


def output_text(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "text": text}


def message(part: dict) -> dict:
    return {"id": MID, "type": "message", "status": "completed", "role": "assistant", "content": [part]}


def numbered(events: list[dict]) -> list[dict]:
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def text_events(text: str = "Hello world", final: list | None = None, done: str | None = None) -> list[dict]:
    """A one-part message streamed as ``text``; every .done and the finished item say ``done`` (``text``
    unless given), the final response lists ``final`` (the finished item unless given)."""
    done = text if done is None else done
    where = {"item_id": MID, "output_index": 0, "content_index": 0}
    return numbered([
        {"type": "response.created", "response": response()},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": MID, "type": "message", "status": "in_progress", "role": "assistant", "content": []}},
        {"type": "response.content_part.added", **where, "part": output_text("")},
        *[{"type": "response.output_text.delta", **where, "delta": d} for d in (text[:5], text[5:]) if d],
        {"type": "response.output_text.done", **where, "text": done},
        {"type": "response.content_part.done", **where, "part": output_text(done)},
        {"type": "response.output_item.done", "output_index": 0, "item": message(output_text(done))},
        {"type": "response.completed", "response": response("completed", final or [message(output_text(done))])},
    ])


def call_events(final: list[dict]) -> list[dict]:
    return numbered([
        {"type": "response.created", "response": response()},
        {"type": "response.output_item.added", "output_index": 0, "item": {**CALL, "status": "in_progress", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": CALL["arguments"]},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 0,
         "arguments": CALL["arguments"]},
        {"type": "response.output_item.done", "output_index": 0, "item": CALL},
        {"type": "response.completed", "response": response("completed", final)},
    ])


def body_of(events: list[dict]) -> bytes:
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


def sdk_client(body: bytes) -> openai.OpenAI:
    http = httpx2.Client(transport=httpx2.MockTransport(
        lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)))
    return openai.OpenAI(api_key="x", base_url="http://t/v1", max_retries=0, http_client=http)


def sdk_final(body: bytes):
    """The response the openai SDK's stream helper hands the app."""
    with sdk_client(body).responses.stream(model="gpt-4o", input="hi") as stream:
        return stream.get_final_response()


def judged(events: list[dict]):
    return analyze_bytes(body_of(events), R)


# -- an item listed twice ---------------------------------------------------------------------

def test_a_message_listed_twice_in_the_final_output_is_corrupt_as_the_sdk_doubles_its_text():
    events = text_events(final=[message(output_text("Hello world"))] * 2)
    assert sdk_final(body_of(events)).output_text == "Hello worldHello world"
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with the final response: it lists output item 0 twice (places 0 "
                              "and 1): the openai SDK hands the app both")
    assert verdict.seq == len(events) - 1


def calls_handed(events: list[dict]) -> list[tuple]:
    return [(item.type, item.call_id, item.arguments) for item in sdk_final(body_of(events)).output]


def test_a_call_listed_twice_in_the_final_output_is_corrupt_as_the_sdk_hands_the_app_two_calls():
    events = call_events([CALL, CALL])
    assert calls_handed(events) == [("function_call", "call_1", CALL["arguments"])] * 2  # the app runs the tool twice
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with the final response: it lists output item 0 twice (places 0 "
                              "and 1): the openai SDK hands the app both")


def test_two_calls_under_one_call_id_in_the_final_output_are_corrupt_whichever_the_sdk_does():
    # the SDK tells calls apart by call_id alone: it hands the app both, or (the other id last) refuses
    other = {**CALL, "id": "fc_2"}
    with pytest.raises(RuntimeError, match="output identity changed"):
        calls_handed(call_events([CALL, other]))
    assert calls_handed(call_events([other, CALL])) == [("function_call", "call_1", CALL["arguments"])] * 2
    for final in ([CALL, other], [other, CALL]):
        verdict = judged(call_events(final)).verdict
        assert verdict.kind is VerdictKind.CORRUPT, verdict
        assert verdict.reason == ("the deltas disagree with the final response: it lists function_call call_id call_1 "
                                  "twice (places 0 and 1): the openai SDK hands the app both, or refuses the response")


def test_each_item_listed_once_stays_complete_as_the_sdk_hands_it_once():
    events = call_events([CALL])
    assert len(sdk_final(body_of(events)).output) == 1
    analysis = judged(events)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [(b.id, b.arguments_raw) for b in analysis.turn.blocks] == [("call_1", CALL["arguments"])]


# -- a refusal part without its refusal string ----------------------------------------------------

@pytest.mark.parametrize("part", [{"type": "refusal", "refusal": None},
                                  {"type": "refusal", "text": "Hello world", "annotations": []}],
                         ids=["refusal null", "text under text"])
@pytest.mark.parametrize("where", ["final response", "finished item"])
def test_a_finished_refusal_part_without_its_refusal_string_is_corrupt_against_streamed_text(part, where):
    events = text_events(final=[message(part)])
    if where == "finished item":
        events[-2]["item"] = message(part)
    final = sdk_final(body_of(events))
    assert final.output[0].content[0].type == "refusal" and final.output_text == ""
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    source = "the final response" if where == "final response" else "response.output_item.done"
    assert verdict.reason == (f"the deltas disagree with {source} at block 0: the part streamed as output_text and "
                              f"{source} gives it as refusal")


# -- a part given empty, then given text -------------------------------------------------------

def test_a_part_every_done_closed_empty_then_given_text_by_the_final_response_is_corrupt():
    events = text_events("", final=[message(output_text("Transfer approved"))])
    assert sdk_final(body_of(events)).output_text == "Transfer approved"
    analysis = judged(events)
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert analysis.verdict.reason == ("the deltas disagree with the final response at block 0, byte 0: "
                                       "response.output_text.done gave it empty")
    assert analysis.verdict.seq == len(events) - 1


def test_a_part_whose_text_done_said_empty_and_whose_part_done_gives_text_is_corrupt():
    events = text_events("", done="Transfer approved")
    events[3]["text"] = ""
    assert events[3]["type"] == "response.output_text.done"
    assert sdk_final(body_of(events)).output_text == "Transfer approved"
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with response.content_part.done at block 0, byte 0: "
                              "response.output_text.done gave it empty")


def finished_item_only(done_text: str, final_text: str) -> list[dict]:
    """A server that sends only the finished item: no part events at all."""
    return numbered([
        {"type": "response.created", "response": response()},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": MID, "type": "message", "status": "in_progress", "role": "assistant", "content": []}},
        {"type": "response.output_item.done", "output_index": 0, "item": message(output_text(done_text))},
        {"type": "response.completed", "response": response("completed", [message(output_text(final_text))])},
    ])


def test_a_finished_item_that_gave_a_part_empty_then_a_final_response_with_text_is_corrupt():
    events = finished_item_only("", "Transfer approved")
    assert sdk_final(body_of(events)).output_text == "Transfer approved"
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with the final response at block 0, byte 0: "
                              "response.output_item.done gave it empty")


@pytest.mark.parametrize("events", [
    finished_item_only("Transfer approved", "Transfer approved"),
    # the part added, then only the finished item: the item fills the part nothing gave before
    [*text_events("")[:3], *copy.deepcopy(finished_item_only("Transfer approved", "Transfer approved")[2:])],
    text_events(""),
], ids=["only the finished item", "part added, then only the finished item", "empty everywhere"])
def test_a_part_no_event_gave_whole_before_takes_the_finished_text_as_the_sdk_does(events):
    events = numbered(events)
    text = sdk_final(body_of(events)).output_text
    analysis = judged(events)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [(b.kind, b.text) for b in analysis.turn.blocks] == [(BlockKind.TEXT, text)]


# -- an event without sequence_number among numbered ones ----------------------------------------

def unnumbered(events: list[dict], *at: int) -> list[dict]:
    events = copy.deepcopy(events)
    for n in at:
        del events[n]["sequence_number"]
    return events


def test_an_unnumbered_event_among_numbered_ones_loses_nothing_the_sdk_reads_it():
    events = unnumbered(text_events(), 3)  # the first delta, in the body, without its number 3
    assert events[3]["type"] == "response.output_text.delta"
    assert sdk_final(body_of(events)).output_text == "Hello world"
    analysis = judged(events)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [(b.kind, b.text) for b in analysis.turn.blocks] == [(BlockKind.TEXT, "Hello world")]
    assert analysis.turn.notes == [
        "event without sequence_number in a numbered stream at seq 3 (byte "
        f"{len(body_of(events[:3]))}): the openai SDK reads it as any other, but its stream helper resuming with "
        "starting_after fails on it"]


def test_the_stream_helper_resuming_with_starting_after_fails_on_an_unnumbered_event_as_the_note_says():
    body = body_of(unnumbered(text_events(), 3))
    with pytest.raises(TypeError):
        with sdk_client(body).responses.stream(response_id="resp_1", starting_after=1) as stream:
            for _ in stream:
                pass


def test_an_unnumbered_event_the_server_never_numbered_loses_nothing():
    events = text_events()
    events.insert(3, {"type": "response.in_progress", "response": response()})  # extra, without a number
    assert sdk_final(body_of(events)).output_text == "Hello world"
    analysis = judged(events)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict


def test_a_gap_wider_than_the_unnumbered_events_between_is_loss():
    events = unnumbered(text_events(), 3)
    del events[5]  # output_text.done, number 5
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("sequence_number jumped from 4 to 6: 1 events lost")
    events = unnumbered(text_events(), 3)
    del events[4]  # the second delta, number 4: the unnumbered one stands in 3, and 4 is lost
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("sequence_number jumped from 2 to 5: 1 events lost (counting the 1 event(s) between "
                              "without sequence_number)")


def test_a_call_whose_arguments_done_said_empty_then_given_arguments_by_the_finished_item_is_corrupt():
    events = call_events([CALL])
    del events[2]  # no delta: function_call_arguments.done says the arguments are empty
    events[2]["arguments"] = ""
    assert events[2]["type"] == "response.function_call_arguments.done"
    assert calls_handed(numbered(events)) == [("function_call", "call_1", CALL["arguments"])]
    verdict = judged(numbered(events)).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with response.output_item.done at block 0, byte 0: "
                              "response.function_call_arguments.done gave it empty")
