"""Responses API: a message part streamed as one kind and finished as another is corrupt.

The openai SDK hands the app the finished item (``output_item.done``) and the terminal event's
``response.output``. A part whose deltas streamed ``output_text`` and that those call a ``refusal``
(or the other way round) gives the app a refusal where the stream showed an answer, even with the
same text: the deltas disagree with the final response. Built from the real Azure text capture
(``../shared``), whose one message part is streamed as output_text.
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
