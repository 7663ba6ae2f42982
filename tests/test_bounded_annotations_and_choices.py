"""Lists that grow per event keep MAX_LISTED items (the rest counted), and a choice or candidate
index streamtap cannot place never lets another choice's content make a stitched answer complete.

Annotations: OpenAI Chat ``delta.annotations`` and Responses ``output_text.annotation.added``
grew a block's citations without a bound; a Responses ``content_part.done`` replaces the list
with the part's whole one, which must keep the same cap and count.

Choices: an index of MAX_CHOICES (128) or more halts the assembly (unknown, saying why), where it
was read as choice 0; an index that is no whole number from 0 is still read as choice 0, but then
an answer that ended is unknown, not complete."""

from __future__ import annotations

import json

import pytest

from streamtap.providers import StreamSession, VerdictKind
from streamtap.providers.common import MAX_CHOICES
from streamtap.providers.judge import MAX_LISTED

BEYOND = 7  # annotations past the cap


def analyze(body: bytes, dialect: str):
    session = StreamSession(dialect, keep_arrivals=False)
    session.feed(body)
    return session.close()


def sse(obj: dict, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def annotation(k: int) -> dict:
    return {"type": "url_citation", "url": f"https://example.com/{k}", "title": f"source {k}",
            "start_index": 0, "end_index": 4}


def only_text_block(analysis):
    (block,) = analysis.turn.blocks
    return block


def assert_capped(analysis, count: int) -> None:
    block = only_text_block(analysis)
    assert len(block.citations) == MAX_LISTED
    assert block.citations[0] == annotation(0) and block.citations[-1] == annotation(MAX_LISTED - 1)
    assert block.extra["citations_dropped"] == count - MAX_LISTED
    assert any(f"citations beyond {MAX_LISTED} per block not kept in memory" in n for n in analysis.turn.notes)


# -- OpenAI Chat Completions ---------------------------------------------------------------

CHAT = {"id": "chatcmpl-B1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-test-1"}


def chat_chunk(*choices: dict) -> bytes:
    return sse({**CHAT, "choices": list(choices)})


def chat_choice(index, delta: dict, finish: str | None = None) -> dict:
    return {"index": index, "delta": delta, "finish_reason": finish}


@pytest.mark.parametrize("per_chunk", [1, 500])
def test_chat_annotations_keep_max_listed_and_count_the_rest(per_chunk):
    count = MAX_LISTED + BEYOND
    chunks = [chat_chunk(chat_choice(0, {"role": "assistant", "content": "word"}))]
    for first in range(0, count, per_chunk):
        notes = [annotation(k) for k in range(first, min(first + per_chunk, count))]
        chunks.append(chat_chunk(chat_choice(0, {"annotations": notes})))
    chunks += [chat_chunk(chat_choice(0, {}, "stop")), b"data: [DONE]\n\n"]
    analysis = analyze(b"".join(chunks), "openai-chat")
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict.reason
    assert_capped(analysis, count)


def chat_choices(n: int, unfinished: int | None) -> bytes:
    """n choices, each a role chunk, then its text, then its finish_reason (but ``unfinished``'s)."""
    chunks = [chat_chunk(chat_choice(i, {"role": "assistant", "content": ""})) for i in range(n)]
    chunks += [chat_chunk(chat_choice(i, {"content": f"answer {i}"})) for i in range(n)]
    chunks += [chat_chunk(chat_choice(i, {}, "stop")) for i in range(n) if i != unfinished]
    return b"".join(chunks) + b"data: [DONE]\n\n"


def test_chat_choice_index_beyond_the_cap_halts_as_unknown_not_complete():
    analysis = analyze(chat_choices(MAX_CHOICES + 2, unfinished=MAX_CHOICES + 1), "openai-chat")
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict.reason
    assert f"choice index {MAX_CHOICES} is beyond the {MAX_CHOICES} choices streamtap assembles" in verdict.reason
    assert verdict.seq == MAX_CHOICES  # the first chunk of choice 128
    assert verdict.evidence["max_choices"] == MAX_CHOICES
    # nothing of a choice past the cap was joined to a choice the turn keeps
    assert all(not choice.blocks or choice.blocks[0].text == f"answer {choice.index}" for choice in analysis.turn.choices)
    assert "answer 128" not in "".join(b.text or "" for b in analysis.turn.blocks)


def test_chat_max_choices_still_assemble():
    whole = analyze(chat_choices(MAX_CHOICES, unfinished=None), "openai-chat")
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict.reason
    assert [c.blocks[0].text for c in whole.turn.choices] == [f"answer {i}" for i in range(MAX_CHOICES)]
    cut = analyze(chat_choices(MAX_CHOICES, unfinished=MAX_CHOICES - 1), "openai-chat")
    assert cut.verdict.kind is VerdictKind.TRUNCATED
    assert f"choice {MAX_CHOICES - 1} never got a finish_reason" in cut.verdict.reason


@pytest.mark.parametrize("index", [True, -1, "1", 1.0, "\x1b[31mred"])
def test_chat_unusable_choice_index_makes_an_ended_answer_unknown(index):
    """Read as choice 0 (where the openai SDK's helper puts True at choice 1 and -1 at the last
    choice, and fails on a string): an unfinished second choice must not make the answer complete."""
    body = b"".join([
        chat_chunk(chat_choice(0, {"role": "assistant", "content": "answer 0"})),
        chat_chunk(chat_choice(index, {"content": "answer 1"})),
        chat_chunk(chat_choice(0, {}, "stop")),
        b"data: [DONE]\n\n",
    ])
    analysis = analyze(body, "openai-chat")
    assert analysis.verdict.kind is VerdictKind.UNKNOWN, analysis.verdict.reason
    assert "is not a choice index" in analysis.verdict.reason
    assert any("is not usable; counted as 0" in n for n in analysis.turn.notes)
    for text in [analysis.verdict.reason, *analysis.turn.notes]:
        assert "\x1b" not in text


# -- OpenAI Responses -----------------------------------------------------------------------

def responses_body(added: int, in_done_part: int, in_done_item: int | None = None) -> bytes:
    """One text part with ``added`` annotation.added events, and ``in_done_part`` annotations in
    its content_part.done (``in_done_item`` in output_item.done and response.completed)."""
    in_done_item = in_done_part if in_done_item is None else in_done_item
    ids = {"item_id": "msg_B1", "output_index": 0, "content_index": 0}
    response = {"id": "resp_B1", "object": "response", "created_at": 1770000000, "status": "in_progress",
                "model": "gpt-test-5", "output": [], "usage": None}
    item = {"id": "msg_B1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    done_item = {**item, "status": "completed",
                 "content": [{**part, "text": "word", "annotations": [annotation(k) for k in range(in_done_item)]}]}
    usage = {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 6}
    events = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ids, "part": part},
        {"type": "response.output_text.delta", **ids, "delta": "word", "logprobs": []},
        *({"type": "response.output_text.annotation.added", **ids, "annotation_index": k, "annotation": annotation(k)}
          for k in range(added)),
        {"type": "response.output_text.done", **ids, "text": "word", "logprobs": []},
        {"type": "response.content_part.done", **ids,
         "part": {**part, "text": "word", "annotations": [annotation(k) for k in range(in_done_part)]}},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": {**response, "status": "completed", "output": [done_item], "usage": usage}},
    ]
    return b"".join(sse({**event, "sequence_number": n}, event["type"]) for n, event in enumerate(events))


@pytest.mark.parametrize("added, in_done_part", [
    (MAX_LISTED + BEYOND, MAX_LISTED + BEYOND),  # the done part's whole list replaces them: counted once
    (0, MAX_LISTED + BEYOND),  # only the done part names them
])
def test_responses_annotations_keep_max_listed_and_count_the_rest(added, in_done_part):
    analysis = analyze(responses_body(added, in_done_part), "openai-responses")
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict.reason
    assert_capped(analysis, in_done_part)


@pytest.mark.parametrize("added, in_done_part", [(MAX_LISTED + BEYOND, 0), (MAX_LISTED + 50, MAX_LISTED + BEYOND), (2, 3)])
def test_responses_annotations_the_done_part_does_not_list_as_added_are_corrupt(added, in_done_part):
    """The final response the app gets holds the finished part's list: added events that say
    otherwise contradict it, counted past the cap too. The turn holds the finished part's list."""
    analysis = analyze(responses_body(added, in_done_part), "openai-responses")
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict.reason
    assert f"lists {in_done_part} annotation(s) for block 0, not the {added}" in analysis.verdict.reason
    citations = only_text_block(analysis).citations
    assert citations == [annotation(k) for k in range(min(in_done_part, MAX_LISTED))]


def test_responses_done_part_within_the_cap_clears_the_count_of_the_added_ones():
    analysis = analyze(responses_body(MAX_LISTED + BEYOND, 3), "openai-responses")
    block = only_text_block(analysis)
    assert block.citations == [annotation(k) for k in range(3)]
    assert "citations_dropped" not in block.extra


# -- Gemini ---------------------------------------------------------------------------------

def gemini_chunk(*candidates: dict) -> bytes:
    return sse({"candidates": list(candidates), "modelVersion": "gemini-test", "responseId": "r-B1"})


def gemini_candidate(index: int, text: str, finish: str | None = None) -> dict:
    candidate = {"index": index, "content": {"role": "model", "parts": [{"text": text}]}}
    return {**candidate, "finishReason": finish} if finish else candidate


def gemini_candidates(n: int, unfinished: int | None) -> bytes:
    """n candidates, each its text then, in one last chunk, every finishReason (but ``unfinished``'s)."""
    chunks = [gemini_chunk(gemini_candidate(i, f"answer {i}")) for i in range(n)]
    chunks.append(gemini_chunk(*(gemini_candidate(i, "", "STOP") for i in range(n) if i != unfinished)))
    return b"".join(chunks)


def test_gemini_candidate_index_beyond_the_cap_halts_as_unknown_saying_why():
    analysis = analyze(gemini_candidates(MAX_CHOICES + 2, unfinished=MAX_CHOICES + 1), "gemini")
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict.reason
    assert f"candidate index {MAX_CHOICES} is beyond the {MAX_CHOICES} candidates streamtap assembles" in verdict.reason
    assert verdict.seq == MAX_CHOICES
    assert "answer 128" not in "".join(b.text or "" for b in analysis.turn.blocks)


def test_gemini_max_candidates_still_assemble():
    analysis = analyze(gemini_candidates(MAX_CHOICES, unfinished=None), "gemini")
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict.reason
    assert [c.blocks[0].text for c in analysis.turn.choices] == [f"answer {i}" for i in range(MAX_CHOICES)]
