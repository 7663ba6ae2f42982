"""Two Gemini turns that must never be `complete`, checked on real captures in both framings
(``alt=sse`` and the streamed JSON array).

A response replayed from its start into the same body brings back the chunks it began with,
byte for byte. Over SSE the replay check catches that. A gateway that re-requests after an
upstream cut can also keep writing into the JSON array it already opened. Then the replay
arrives as more elements of that array, not as a second ``[``. The app gets the text twice, so
both framings must say `unknown`, for any read size.

In a streamed (Vertex ``partialArgs``) function call, only the opening part names the call. A
nameless functionCall part while no call is open continues a call whose opening part was lost,
or repeats a closing ``{"functionCall": {}}`` part. Read as a call of its own, it would hand the
app a call with no name: corrupt."""

from __future__ import annotations

import orjson
import pytest
from conftest import shared_path
from provider_streams import chunk_lines, frame_gemini_array, frame_gemini_sse

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

GEMINI = Dialect.GEMINI
FRAMINGS = {"sse": frame_gemini_sse, "json-array": frame_gemini_array}
GOOGLE = "fixtures", "vercel-ai", "google"


def capture(name: str) -> list[bytes]:
    return chunk_lines(shared_path(*GOOGLE, name))


def judged(lines: list[bytes], framing: str, chunk_size: int | None = None):
    return analyze_bytes(FRAMINGS[framing](lines), GEMINI, wire=framing, chunk_size=chunk_size)


def parts(line: bytes) -> list[dict]:
    return orjson.loads(line)["candidates"][0]["content"]["parts"]


def finished(line: bytes) -> bool:
    return bool(orjson.loads(line)["candidates"][0].get("finishReason"))


@pytest.mark.parametrize("name", ["google-text.chunks.txt", "google-reasoning.chunks.txt"])
def test_a_real_body_replayed_inside_the_open_array_is_unknown_as_over_sse(name):
    lines = capture(name)
    for framing in FRAMINGS:
        whole = judged(lines, framing)
        assert whole.verdict.kind is VerdictKind.COMPLETE, (framing, whole.verdict)  # the control
        assert judged(lines, framing, chunk_size=1).verdict == whole.verdict
    for cut in range(1, len(lines)):
        replayed = lines[:cut] + lines  # cut after `cut` chunks, then the response again from its start
        seen = {}
        for framing in FRAMINGS:
            verdict = judged(replayed, framing).verdict
            assert verdict.kind is VerdictKind.UNKNOWN, (framing, cut, verdict)
            assert f"first {cut} chunk(s) come again, byte for byte, from seq {cut}" in verdict.reason, (framing, verdict)
            assert judged(replayed, framing, chunk_size=1).verdict == verdict, (framing, cut)
            seen[framing] = verdict
        assert seen["sse"].seq == seen["json-array"].seq == cut


STREAMED_CALLS = ["google-stream-no-args-tool-call.chunks.txt", "google-stream-tool-call-arguments.chunks.txt"]


def opening_parts(lines: list[bytes]) -> list[int]:
    """The chunks whose part opens a streamed call: the only parts that carry its name."""
    return [i for i, line in enumerate(lines)
            if any(p.get("functionCall", {}).get("name") and p["functionCall"].get("willContinue") for p in parts(line))]


def closing_parts(lines: list[bytes]) -> list[int]:
    """The chunks that only close a streamed call (``{"functionCall": {}}``) and finish nothing."""
    return [i for i, line in enumerate(lines) if parts(line) == [{"functionCall": {}}] and not finished(line)]


@pytest.mark.parametrize("name", STREAMED_CALLS)
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_real_streamed_call_unmodified_is_complete_with_every_call_named(name, framing):
    analysis = judged(capture(name), framing)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    calls = analysis.turn.tool_calls()
    assert calls and all(call.name for call in calls), [(call.name, call.arguments) for call in calls]


@pytest.mark.parametrize("name", STREAMED_CALLS)
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_real_streamed_call_without_its_opening_part_is_corrupt(name, framing):
    lines = capture(name)
    openings = opening_parts(lines)
    assert len(openings) >= 2, openings  # the captures stream several calls
    for dropped in openings:
        verdict = judged(lines[:dropped] + lines[dropped + 1 :], framing).verdict
        assert verdict.kind is VerdictKind.CORRUPT, (dropped, verdict)
        assert "functionCall part without a name" in verdict.reason and "no streamed call is open" in verdict.reason
        assert verdict.seq == dropped, (dropped, verdict)  # the first continuation part, now in the dropped one's place


@pytest.mark.parametrize("name", STREAMED_CALLS)
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_a_real_streamed_call_with_its_closing_part_twice_is_corrupt(name, framing):
    lines = capture(name)
    closings = closing_parts(lines)
    assert closings, "the capture closes a call before its last chunk"
    for repeated in closings:
        verdict = judged(lines[: repeated + 1] + lines[repeated:], framing).verdict
        assert verdict.kind is VerdictKind.CORRUPT, (repeated, verdict)
        assert "functionCall part without a name" in verdict.reason, verdict
        assert verdict.seq == repeated + 1, (repeated, verdict)
