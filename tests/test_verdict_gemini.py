"""Gemini verdicts that must never be complete: a responseId that changes mid-stream
(provider-streams.md §5.5), a streamed function call still open at finishReason STOP (§5.3),
a part that sets two members of the Part.data oneof (text and a functionCall, say), a
finishReason written as a number the Gemini API and Vertex AI do not name alike, and a chunk
spread over several data lines (older google-genai fails on it), and a candidatesTokenCount that
falls. Numbered enums that both APIs share read as their names."""

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


def judged(lines: list[bytes], framing: str, chunk_size: int | None = None):
    return analyze_bytes(FRAMINGS[framing](lines), GEMINI, wire=framing, chunk_size=chunk_size)


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


# `$alt=json;enum-encoding=int` (Google's REST client libraries): enums come as numbers
SHARED_FINISH_NUMBERS = [(1, "STOP", VerdictKind.COMPLETE), (2, "MAX_TOKENS", VerdictKind.STOPPED_BY_LIMIT),
                         (3, "SAFETY", VerdictKind.FILTERED), (4, "RECITATION", VerdictKind.FILTERED),
                         (5, "OTHER", VerdictKind.UNKNOWN)]


@pytest.mark.parametrize("chunk_size", [1, None])
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_finish_reason_written_as_a_shared_number_reads_as_its_name(framing, chunk_size):
    """1 to 5 name the same reasons in the Gemini API and in Vertex AI: the verdict and the raw stop
    reason are those of the name."""
    for number, name, kind in SHARED_FINISH_NUMBERS:
        lines = [chunk([{"text": "The capital"}], "A"), chunk([{"text": " is Paris."}], "A", number)]
        analysis = judged(lines, framing, chunk_size)
        assert analysis.verdict.kind is kind, (number, analysis.verdict)
        assert analysis.turn.stop_reason_raw == name and analysis.turn.choices[0].stop_reason == name
        by_name = judged([lines[0], chunk([{"text": " is Paris."}], "A", name)], framing, chunk_size)
        assert (analysis.verdict.kind, analysis.verdict.reason) == (by_name.verdict.kind, by_name.verdict.reason), number
    # the legacy STOP on every chunk, one written as a number and one as a name, is one reason
    stamped = [chunk([{"text": "The capital"}], "A", 1), chunk([{"text": " is Paris."}], "A", "STOP")]
    assert judged(stamped, framing, chunk_size).verdict.kind is VerdictKind.UNKNOWN  # as with both named STOP


@pytest.mark.parametrize("chunk_size", [1, None])
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_finish_reason_number_the_apis_do_not_share_is_unknown_and_named(framing, chunk_size):
    """6 is LANGUAGE in the Gemini API and BLOCKLIST in Vertex AI (and so on up); the assembler does not
    know which host answered, so such a number, or one neither names, is never read as a name."""
    for number in (6, 9, 10, 12, 17, 99):
        lines = [chunk([{"text": "The capital"}], "A"), chunk([{"text": " is Paris."}], "A", number)]
        analysis = judged(lines, framing, chunk_size)
        verdict = analysis.verdict
        assert verdict.kind is VerdictKind.UNKNOWN, (number, verdict)
        assert f"after stop reason {number}" in verdict.reason and "written as a number" in verdict.reason, verdict
        assert analysis.turn.stop_reason_raw == str(number)
    named = judged([chunk([{"text": "Paris."}], "A", "STOP")], framing, chunk_size).verdict
    assert "written as a number" not in named.reason  # only a number is explained as one


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_block_reason_written_as_a_number_reads_as_its_name(framing):
    for number, name in [(1, "SAFETY"), (3, "BLOCKLIST"), (4, "PROHIBITED_CONTENT"), (5, "5")]:
        analysis = judged([orjson.dumps({"promptFeedback": {"blockReason": number}, "responseId": "A"})], framing)
        assert analysis.verdict.kind is VerdictKind.FILTERED, analysis.verdict  # any block reason blocks the prompt
        assert analysis.turn.stop_reason_raw == f"blockReason:{name}", analysis.turn.stop_reason_raw


def split_over_data_lines(line: bytes, at: bytes = b"[", line_end: bytes = b"\r\n") -> bytes:
    """One chunk's JSON on two data lines, which the SSE rules join with a line feed."""
    cut = line.index(at)
    return b"data: " + line[:cut] + line_end + b"data: " + line[cut:] + line_end + line_end


@pytest.mark.parametrize("chunk_size", [1, None])
@pytest.mark.parametrize("line_end", [b"\r\n", b"\n"])
def test_a_chunk_over_several_data_lines_is_unknown(chunk_size, line_end):
    """google-genai before 1.74.0 parses each `data: ` line alone and raises on the first part; 1.74.0
    and later join them as the SSE rules do. The bytes cannot tell which client read them."""
    first = chunk([{"text": "The capital"}], "A")
    body = frame_gemini_sse([first]) + split_over_data_lines(chunk([{"text": " is Paris."}], "A", "STOP"), line_end=line_end)
    analysis = analyze_bytes(body, GEMINI, wire="sse", chunk_size=chunk_size)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict
    assert "spreads its JSON over 2 data lines" in verdict.reason and "before 1.74.0" in verdict.reason, verdict
    assert verdict.seq == 1 and analysis.turn.text() == "The capital is Paris."  # read as the SSE rules join it
    whole = frame_gemini_sse([first, chunk([{"text": " is Paris."}], "A", "STOP")])
    assert analyze_bytes(whole, GEMINI, wire="sse", chunk_size=chunk_size).verdict.kind is VerdictKind.COMPLETE


@pytest.mark.parametrize("chunk_size", [1, 7, None])
@pytest.mark.parametrize("line_end", [b"\r\n", b"\n"])
def test_two_chunks_on_data_lines_of_one_event_are_unknown(chunk_size, line_end):
    """The blank line between two events lost: the rules join their data lines, which is no JSON, so
    google-genai 1.74.0 and later fail; before, it parses each line alone and reads both chunks. The
    turn holds what those read."""
    first, last = chunk([{"text": "The capital"}], "A"), chunk([{"text": " is Paris."}], "A", "STOP")
    body = b"data: " + first + line_end + b"data: " + last + line_end + line_end
    analysis = analyze_bytes(body, GEMINI, wire="sse", chunk_size=chunk_size)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict
    assert "2 data lines that are each a chunk" in verdict.reason and "before 1.74.0" in verdict.reason, verdict
    assert analysis.turn.text() == "The capital is Paris." and analysis.turn.stop_reason_raw == "STOP"
    # a cut after them stays truncated: only an answer that ended is doubted
    cut = b"data: " + first + line_end + b"data: " + chunk([{"text": " is"}], "A") + line_end + line_end
    assert analyze_bytes(cut, GEMINI, wire="sse").verdict.kind is VerdictKind.TRUNCATED


def test_a_split_chunk_does_not_hide_a_worse_verdict():
    """Only an answer that ended is doubted: a cut stays truncated, a second generation corrupt."""
    first = chunk([{"text": "The capital"}], "A")
    cut = frame_gemini_sse([first]) + split_over_data_lines(chunk([{"text": " is"}], "A"))
    assert analyze_bytes(cut, GEMINI, wire="sse").verdict.kind is VerdictKind.TRUNCATED
    stitched = cut + frame_gemini_sse([chunk([{"text": "Paris."}], "B", "STOP")])
    assert analyze_bytes(stitched, GEMINI, wire="sse").verdict.kind is VerdictKind.CORRUPT


def counted(text: str, candidates_tokens: int, finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0, **({"finishReason": finish} if finish else {})}
    usage = {"promptTokenCount": 9, "candidatesTokenCount": candidates_tokens, "totalTokenCount": 9 + candidates_tokens}
    return orjson.dumps({"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-1.5-flash-002"})


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_candidates_token_count_that_falls_is_unknown_never_complete(framing):
    """usageMetadata is cumulative (§5.3): a count that falls is a second generation or chunks out of
    order where no responseId tells; the turn is unknown (a server counting otherwise is not ruled out)."""
    rising = [counted("The capital of", 4), counted(" France is", 7), counted(" Paris.", 9, "STOP")]
    assert judged(rising, framing).verdict.kind is VerdictKind.COMPLETE
    stitched = [counted("The capital of", 4), counted(" France is", 7), counted("Paris is the", 3),
                counted(" capital of France.", 8, "STOP")]
    for chunk_size in (None, 1):
        verdict = judged(stitched, framing, chunk_size).verdict
        assert verdict.kind is VerdictKind.UNKNOWN, verdict
        assert "candidatesTokenCount falls from 7 (seq 1) to 3 at seq 2" in verdict.reason, verdict
        assert verdict.evidence["counts"] == [7, 3] and verdict.evidence["was"] == "complete"
