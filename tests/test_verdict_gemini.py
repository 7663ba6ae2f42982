"""Gemini verdicts that must never be complete: a responseId that changes mid-stream
(provider-streams.md §5.5), a streamed function call still open at finishReason STOP (§5.3),
and a part that sets two members of the Part.data oneof (text and a functionCall, say)."""

from __future__ import annotations

import orjson
import pytest
from provider_streams import chunk_lines, frame_gemini_array, frame_gemini_sse, vercel

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

GEMINI = Dialect.GEMINI
FRAMINGS = {"sse": frame_gemini_sse, "json-array": frame_gemini_array}


def chunk(parts: list[dict], response_id: str | None = None, finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0, **({"finishReason": finish} if finish else {})}
    return orjson.dumps({"candidates": [candidate], **({"responseId": response_id} if response_id else {})})


def judged(lines: list[bytes], framing: str):
    return analyze_bytes(FRAMINGS[framing](lines), GEMINI, wire=framing)


def open_call(name: str = "get_weather") -> list[bytes]:
    """A streamed call whose last part still says willContinue: no closing part follows."""
    return [
        chunk([{"functionCall": {"name": name, "willContinue": True}}], "A"),
        chunk([{"functionCall": {"willContinue": True, "partialArgs": [
            {"jsonPath": "$.city", "stringValue": "Par", "willContinue": True}]}}], "A"),
    ]


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_response_id_change_is_corrupt_and_names_both_ids(framing):
    lines = [chunk([{"text": "The capital"}], "A"), chunk([{"text": "Paris is big."}], "B", "STOP")]
    verdict = judged(lines, framing).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "responseId changed from A" in verdict.reason and "to B" in verdict.reason
    assert verdict.seq == 1


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_chunks_without_a_response_id_are_not_compared(framing):
    for ids in ([None, None], ["A", None], [None, "A"], ["A", "A"]):
        lines = [chunk([{"text": "The capital"}], ids[0]), chunk([{"text": " is Paris."}], ids[1], "STOP")]
        assert judged(lines, framing).verdict.kind is VerdictKind.COMPLETE, ids


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_model_version_change_without_response_ids_is_corrupt(framing):
    """Older captures and some gateways send no responseId: a retry served by another model,
    stitched after a cut, is told by its modelVersion."""
    def versioned(line: bytes, version: str) -> bytes:
        return orjson.dumps({**orjson.loads(line), "modelVersion": version})

    lines = [versioned(chunk([{"text": "The capital of France"}]), "gemini-1.5-flash-002"),
             versioned(chunk([{"text": "The capital of France is Paris."}], finish="STOP"), "gemini-1.5-pro-002")]
    verdict = judged(lines, framing).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "modelVersion changed from gemini-1.5-flash-002" in verdict.reason, verdict
    assert verdict.seq == 1
    same = [versioned(lines[0], "gemini-1.5-pro-002"), lines[1]]
    assert judged(same, framing).verdict.kind is VerdictKind.COMPLETE
    unnamed = [chunk([{"text": "The capital"}]), versioned(chunk([{"text": " is Paris."}], finish="STOP"), "gemini-1.5-pro-002")]
    assert judged(unnamed, framing).verdict.kind is VerdictKind.COMPLETE  # a chunk that names no model is not compared


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_the_text_and_thought_blocks_of_a_finished_candidate_are_closed(framing):
    """Gemini parts have no end of their own: the candidate's finishReason ends them, so show does
    not mark a whole answer's blocks as ones the stream stopped inside."""
    lines = [chunk([{"text": "Let me think", "thought": True}], "A"), chunk([{"text": "Paris."}], "A", "STOP")]
    analysis = judged(lines, framing)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [(b.kind.value, b.closed) for b in analysis.turn.blocks] == [("thinking", True), ("text", True)]
    # an answer an error cut (no finishReason) was stopped inside
    cut = judged([chunk([{"text": "The capital"}], "A"), orjson.dumps({"error": {"code": 503, "message": "busy"}})], framing)
    assert cut.verdict.kind is VerdictKind.ERRORED and [b.closed for b in cut.turn.blocks] == [False], cut.verdict


def real_lines(name: str) -> list[bytes]:
    """The chunks of a real Gemini capture (the AI SDK's), or a skip saying it is absent."""
    path = vercel("google", name)
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return chunk_lines(path)


def test_a_real_capture_with_another_response_id_on_its_last_chunk_is_corrupt():
    lines = real_lines("google-text.chunks.txt")
    last = orjson.loads(lines[-1])
    assert last["responseId"]
    lines[-1] = orjson.dumps({**last, "responseId": "retry-" + last["responseId"]})
    for framing in FRAMINGS:
        assert judged(lines, framing).verdict.kind is VerdictKind.CORRUPT, framing


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_streamed_call_still_open_at_stop_is_corrupt_and_named(framing):
    analysis = judged(open_call() + [chunk([{"text": ""}], "A", "STOP")], framing)
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert "get_weather" in analysis.verdict.reason and "never finished" in analysis.verdict.reason
    call, = analysis.turn.tool_calls()
    assert not call.closed and call.arguments == {"city": "Par"}


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_streamed_call_closed_on_the_stop_chunk_is_complete(framing):
    ends_string = {"functionCall": {"willContinue": True, "partialArgs": [{"jsonPath": "$.city", "stringValue": "is"}]}}
    analysis = judged(open_call() + [chunk([ends_string], "A"), chunk([{"functionCall": {}}], "A", "STOP")], framing)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    call, = analysis.turn.tool_calls()
    assert call.closed and call.arguments == {"city": "Paris"}


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_call_that_closes_while_an_argument_still_continues_is_corrupt(framing):
    """``"Par"`` parses: only the argument's own willContinue says that more of it was due."""
    verdict = judged(open_call() + [chunk([{"functionCall": {}}], "A", "STOP")], framing).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "$.city" in verdict.reason and "willContinue" in verdict.reason, verdict


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_the_same_call_started_again_while_it_is_open_is_corrupt(framing):
    """A retry of a cut call, stitched after it: its arguments must not be spliced into the first."""
    retry = open_call() + [
        chunk([{"functionCall": {"partialArgs": [{"jsonPath": "$.city", "stringValue": "is"}, {"jsonPath": "$.city", "stringValue": ""}],
                                 "willContinue": True}}], "A"),
        chunk([{"functionCall": {}}], "A", "STOP"),
    ]
    analysis = judged(retry, framing)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict  # the control: no restart, one call
    assert analysis.turn.tool_calls()[0].arguments == {"city": "Paris"}
    stitched = open_call() + retry
    verdict = judged(stitched, framing).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "starts again" in verdict.reason, verdict


def test_an_open_call_under_a_limit_or_without_a_finish_keeps_its_verdict():
    limit = judged(open_call() + [chunk([], "A", "MAX_TOKENS")], "sse").verdict
    assert limit.kind is VerdictKind.STOPPED_BY_LIMIT, limit
    assert limit.evidence["cut_tool_calls"] == [[0, 0]], limit.evidence  # as a cut call of any dialect is
    assert judged(open_call(), "sse").verdict.kind is VerdictKind.TRUNCATED


def test_a_real_streamed_call_capture_without_its_closing_part_is_not_complete():
    lines = real_lines("google-stream-tool-call-arguments.chunks.txt")
    last = orjson.loads(lines[-1])
    assert last["candidates"][0]["content"]["parts"] == [{"functionCall": {}}]  # the second call's closing part
    last["candidates"][0]["content"]["parts"] = [{"text": ""}]
    lines[-1] = orjson.dumps(last)
    verdict = judged(lines, "sse").verdict
    assert verdict.kind is VerdictKind.CORRUPT and "getWeather" in verdict.reason, verdict


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_part_with_both_text_and_a_function_call_is_corrupt(framing):
    """Part.data is a oneof: the API never sends text and a functionCall in one part, and read as
    either one the other is lost."""
    both = {"text": "Let me check.", "functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
    analysis = judged([chunk([both], "A", "STOP")], framing)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "sets text and functionCall" in verdict.reason and verdict.evidence["fields"] == ["text", "functionCall"]
    assert verdict.seq == 0, verdict


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_text_and_a_call_in_parts_of_their_own_stay_complete(framing):
    """The shapes the API sends: one data member per part, with thought and thoughtSignature beside it
    (an empty text beside a call loses nothing either)."""
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2ln"}
    for parts in ([{"text": "Let me check."}, call], [{"text": "hm", "thought": True}, call],
                  [{**call, "text": ""}], [{"text": "", "thoughtSignature": "c2ln"}, call]):
        analysis = judged([chunk(parts, "A", "STOP")], framing)
        assert analysis.verdict.kind is VerdictKind.COMPLETE, (parts, analysis.verdict)
        assert analysis.turn.tool_calls()[0].arguments == {"city": "Paris"}


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_another_function_call_while_a_streamed_one_is_open_is_corrupt(framing):
    """The open call's closing part never came: the new call's parts are not the open call's."""
    closing = chunk([{"functionCall": {}}], "A")
    for new_call in ({"name": "get_time", "willContinue": True}, {"name": "get_time", "args": {"zone": "CET"}}):
        lines = open_call() + [chunk([{"functionCall": new_call}], "A"), closing, chunk([{"text": ""}], "A", "STOP")]
        verdict = judged(lines, framing).verdict
        assert verdict.kind is VerdictKind.CORRUPT, (new_call, verdict)
        assert "get_time starts" in verdict.reason and "get_weather is still open" in verdict.reason, verdict
