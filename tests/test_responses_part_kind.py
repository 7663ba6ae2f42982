"""Responses API: a content part whose own events disagree on its kind is corrupt.

The openai SDK hands the app the finished item (``output_item.done``) and the terminal event's
``response.output``. A part whose deltas streamed ``output_text`` and that those call a ``refusal``
(or the other way round) gives the app a refusal where the stream showed an answer, even with the
same text: the deltas disagree with the final response. Built from the real Azure text capture
(``../shared``), whose one message part is streamed as output_text. The same holds between answer
and reasoning: an ``output_text`` part in a reasoning item, a ``reasoning_text`` part in a message,
a delta of another kind than its part, or a finished part of another kind (constructed streams).
"""

from __future__ import annotations

import copy

import orjson
import pytest
from provider_streams import chunk_lines, frame_responses
from conftest import shared_path

from streamtap.providers import BlockKind, Dialect, VerdictKind, analyze_bytes

R = Dialect.OPENAI_RESPONSES
# the capture's events by position: content_part.added, output_text.delta, output_text.done,
# content_part.done, output_item.done, response.completed
PART_ADDED, DELTA, TEXT_DONE, PART_DONE, ITEM_DONE, COMPLETED = range(3, 9)


def captured() -> list[dict]:
    path = shared_path("fixtures", "vercel-ai", "azure", "azure-text.1.chunks.txt")  # skips where ../shared is absent
    events = [orjson.loads(line) for line in chunk_lines(path)]
    assert [e["type"] for e in events[PART_ADDED:]] == [
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    return events


def as_refusal(part: dict) -> dict:
    return {"type": "refusal", "refusal": part["text"]}


def finished_as_refusal(events: list[dict]) -> list[dict]:
    """The finished item and the final response call the streamed output_text part a refusal."""
    events = copy.deepcopy(events)
    item = events[ITEM_DONE]["item"]
    item["content"] = [as_refusal(item["content"][0])]
    events[COMPLETED]["response"]["output"] = [item]
    return events


def streamed_as_refusal(events: list[dict]) -> list[dict]:
    """The part's events stream a refusal: added, deltas, done and content_part.done all say so."""
    events = copy.deepcopy(events)
    events[PART_ADDED]["part"] = {"type": "refusal", "refusal": ""}
    events[DELTA] = {k: v for k, v in events[DELTA].items() if k not in ("logprobs", "obfuscation")}
    events[DELTA]["type"] = "response.refusal.delta"
    text = events[TEXT_DONE].pop("text")
    events[TEXT_DONE] = {k: v for k, v in events[TEXT_DONE].items() if k != "logprobs"}
    events[TEXT_DONE].update(type="response.refusal.done", refusal=text)
    events[PART_DONE]["part"] = as_refusal(events[PART_DONE]["part"])
    return events


def judged(events: list[dict]):
    return analyze_bytes(frame_responses([orjson.dumps(e) for e in events]), R)


def test_the_unmodified_capture_is_complete_with_a_text_block():
    analysis = judged(captured())
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [(b.kind, b.text) for b in analysis.turn.blocks] == [(BlockKind.TEXT, "Hello")]


def test_output_text_streamed_and_finished_as_a_refusal_is_corrupt_naming_both_kinds():
    verdict = judged(finished_as_refusal(captured())).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with response.output_item.done at block 0: the part streamed as "
                              "output_text and response.output_item.done gives it as refusal")
    assert verdict.seq == ITEM_DONE
    assert verdict.evidence["streamed_type"] == "output_text" and verdict.evidence["final_type"] == "refusal"


def test_only_the_final_response_calling_it_a_refusal_is_corrupt_too():
    events = captured()
    final = events[COMPLETED]["response"]["output"][0]
    final["content"] = [as_refusal(final["content"][0])]
    verdict = judged(events).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with the final response at block 0: the part streamed as "
                              "output_text and the final response gives it as refusal")
    assert verdict.seq == COMPLETED


def test_a_refusal_streamed_and_finished_as_output_text_is_corrupt_naming_both_kinds():
    verdict = judged(streamed_as_refusal(captured())).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == ("the deltas disagree with response.output_item.done at block 0: the part streamed as "
                              "refusal and response.output_item.done gives it as output_text")


@pytest.mark.parametrize("cut", [0, 1, 7])
def test_a_kind_mismatch_is_corrupt_however_the_body_is_chunked(cut):
    body = frame_responses([orjson.dumps(e) for e in finished_as_refusal(captured())])
    verdict = analyze_bytes(body, R, chunk_size=cut or None).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "streamed as output_text" in verdict.reason, verdict


def test_a_refusal_streamed_and_finished_as_a_refusal_stays_filtered():
    analysis = judged(finished_as_refusal(streamed_as_refusal(captured())))
    assert analysis.verdict.kind is VerdictKind.FILTERED, analysis.verdict
    assert analysis.turn.stop_reason == "refusal"
    assert [(b.kind, b.text) for b in analysis.turn.blocks] == [(BlockKind.REFUSAL, "Hello")]


# -- reasoning and answer: the same rule, between a part's kind, its item's and its events' -----------

def one_part_answer(item_type: str, part_added: str, delta: str, final_part: str, text: str = "The answer is 42") -> list[dict]:
    """The events of a whole, gap-free Responses stream of one item and one content part, each stage naming its own kind."""
    added = ({"id": "it_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
             if item_type == "message" else {"id": "it_1", "type": "reasoning", "summary": [], "content": []})
    final = {**added, "status": "completed", "content": [{"type": final_part, "text": text}]}
    at = {"item_id": "it_1", "output_index": 0, "content_index": 0}
    response = {"id": "resp_1", "object": "response", "model": "gpt-test"}
    return [{**event, "sequence_number": number} for number, event in enumerate([
        {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        {"type": "response.content_part.added", **at, "part": {"type": part_added, "text": ""}},
        {"type": f"response.{delta}.delta", **at, "delta": text},
        {"type": f"response.{delta}.done", **at, "text": text},
        {"type": "response.content_part.done", **at, "part": {"type": part_added, "text": text}},
        {"type": "response.output_item.done", "output_index": 0, "item": final},
        {"type": "response.completed", "response": {**response, "status": "completed", "output": [final]}},
    ])]


@pytest.mark.parametrize(("item_type", "part_added", "delta", "final_part", "found"), [
    ("reasoning", "output_text", "output_text", "reasoning_text", "added as output_text, which a reasoning item does not hold"),
    ("message", "reasoning_text", "reasoning_text", "output_text", "added as reasoning_text, which a message item does not hold"),
    ("message", "reasoning_text", "output_text", "output_text", "added as reasoning_text, which a message item does not hold"),
    ("message", "output_text", "reasoning_text", "output_text", "reasoning_text.delta for content part 0 of output item 0, which was added as output_text"),
    ("message", "output_text", "refusal", "output_text", "refusal.delta for content part 0 of output item 0, which was added as output_text"),
    ("message", "output_text", "output_text", "reasoning_text", "the part streamed as output_text and response.output_item.done gives it as reasoning_text"),
    ("reasoning", "reasoning_text", "reasoning_text", "output_text", "the part streamed as reasoning_text and response.output_item.done gives it as output_text"),
])
def test_a_part_whose_kind_its_own_events_contradict_is_corrupt(item_type, part_added, delta, final_part, found):
    """Reasoning streamed as the answer, or the answer as reasoning: the app gets one where the turn
    would show the other (the SDK's stream helper fails on most of these)."""
    verdict = judged(one_part_answer(item_type, part_added, delta, final_part)).verdict
    assert verdict.kind is VerdictKind.CORRUPT and found in verdict.reason, verdict


@pytest.mark.parametrize(("item_type", "part", "kind"), [("message", "output_text", BlockKind.TEXT),
                                                         ("reasoning", "reasoning_text", BlockKind.THINKING)])
def test_a_part_whose_events_agree_on_its_kind_stays_complete(item_type, part, kind):
    analysis = judged(one_part_answer(item_type, part, part, part))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [(block.kind, block.text) for block in analysis.turn.blocks] == [(kind, "The answer is 42")]
