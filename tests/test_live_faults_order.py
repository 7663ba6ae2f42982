"""Live faults (LiveFaults fed the upstream body in chunks) against replay (plan()) on the same
stream, sans-IO: of several cuts, or a cut and an injected error, the earliest position ends
the stream in its style, however the body came in; an error on Gemini's JSON-array stream is
an element of the array; event faults before the first event are refused; a cut before the
first event ends even a stream that serves none."""

from __future__ import annotations

import json

import pytest
from replay_streams import anthropic_frames, openai_chat_frames

from streamtap.providers import analyze_bytes
from streamtap.providers.turn import VerdictKind
from streamtap.replay.faults import FaultSpecError, LiveFaults, parse_faults, plan
from streamtap.replay.source import Frame, Source

CHUNKS = (1, 7, 100, 10**9)


def openai() -> Source:
    return Source.from_frames(openai_chat_frames(), wire="sse", dialect="openai-chat")


def anthropic() -> Source:
    return Source.from_frames(anthropic_frames(), wire="sse", dialect="anthropic")


def gemini_array(texts: tuple[str, ...] = ("Hello", " there", ", friend")) -> Source:
    """A Gemini ``streamGenerateContent`` answer without ``alt=sse``: one JSON array, written as it goes."""
    elements = []
    for i, text in enumerate(texts):
        candidate = '{"content":{"role":"model","parts":[{"text":"%s"}]},"index":0%s}' % (
            text, ',"finishReason":"STOP"' if i == len(texts) - 1 else "")
        elements.append(("[" if i == 0 else "\r\n,\r\n") + '{"candidates":[%s],"modelVersion":"gemini-2.5-flash"}' % candidate)
    frames = [Frame(i, raw.encode(), 0.0) for i, raw in enumerate(elements)] + [Frame(None, b"\r\n]\n", 0.0)]
    return Source("<constructed>", "POST", "http://127.0.0.1/", None, 200, [("content-type", "application/json")],
                  frames, wire="json-array", dialect="gemini")


def live(src: Source, spec: str, chunk: int) -> tuple[bytes, str, list[str]]:
    faults = LiveFaults(parse_faults(spec), src.wire, src.dialect)
    body, out = src.body, []
    for i in range(0, len(body), chunk):
        out += faults.feed(body[i : i + chunk])
    out += faults.close()
    faults.ended()
    return b"".join(out), faults.end or "clean", faults.log


def assert_as_replay(src: Source, spec: str) -> list[str]:
    expected = plan(src, parse_faults(spec))
    for chunk in CHUNKS:
        body, end, log = live(src, spec, chunk)
        assert (len(body), end) == (len(expected.body), expected.end.style), (spec, chunk, log, expected.log)
        assert body == expected.body, (spec, chunk)
    return log


@pytest.mark.parametrize(
    "make, spec",
    [
        (openai, "cut:byte=50;cut:event=0"),
        (openai, "cut:event=0;cut:byte=50,style=reset"),
        (openai, "cut:byte=3000;cut:byte=1000,style=abort"),
        (openai, "error:kind=openai,after=3;cut:byte=700,style=reset"),
        (anthropic, "cut:at=tool-args;cut:byte=2800,style=abort"),
        (anthropic, "cut:at=tool-args,style=reset;cut:event=22,style=abort"),
        (anthropic, "cut:event=22,style=abort;cut:at=tool-args,style=reset"),
        (anthropic, "cut:at=before-terminal,style=reset;cut:at=tool-args"),
        (anthropic, "cut:at=tool-args;cut:event=29,style=abort;error:kind=overloaded_error,after=33"),
        # a tie: the cut first in the spec ends the stream
        (anthropic, "cut:event=33;cut:at=before-terminal,style=reset"),
        (anthropic, "cut:at=before-terminal,style=reset;cut:event=33"),
    ],
)
def test_the_earliest_cut_ends_the_stream_in_its_style_however_the_body_comes_in(make, spec):
    src = make()
    expected = plan(src, parse_faults(spec))
    winner = next(line for line in expected.log if " cut at byte " in line).split(":", 2)[:2]
    log = assert_as_replay(src, spec)
    assert any(line.startswith(":".join(winner) + ":") and " cut at byte " in line for line in log), log
    later = [line for line in log if ": not reached, the stream is cut at byte " in line]
    assert len(later) == len([fault for fault in parse_faults(spec) if fault.kind == "cut"]) - 1, log


def test_an_error_on_a_json_array_stream_is_an_element_and_the_array_closes_once():
    src = gemini_array()
    assert analyze_bytes(src.body, "gemini", wire="json-array").verdict.kind is VerdictKind.COMPLETE
    for after in (-1, 0, 1):
        spec = f"error:kind=openai,after={after}"
        assert_as_replay(src, spec)
        body = plan(src, parse_faults(spec)).body
        elements = json.loads(body)  # one array, closed once
        assert len(elements) == after + 2 and elements[-1]["error"]["status"] == "INTERNAL", body
        assert analyze_bytes(body, "gemini", wire="json-array").verdict.kind is VerdictKind.ERRORED, body


@pytest.mark.parametrize("spec", ["drop:event=-1", "reorder:event=-1", "duplicate:event=-1"])
def test_an_event_fault_before_the_first_event_is_refused_live_as_in_replay(spec):
    with pytest.raises(FaultSpecError, match="event -1 does not exist"):
        plan(openai(), parse_faults(spec))
    with pytest.raises(FaultSpecError, match="event -1 does not exist"):
        LiveFaults(parse_faults(spec), "sse", "openai-chat")


@pytest.mark.parametrize("spec", ["drop:event=0;cut:event=-1,style=reset", "cut:event=-1,style=abort"])
def test_a_cut_before_the_first_event_ends_a_stream_that_serves_none(spec):
    src = Source.from_frames(openai_chat_frames()[:1], wire="sse", dialect="openai-chat")
    log = assert_as_replay(src, spec)
    assert not any("not reached" in line for line in log), log


@pytest.mark.parametrize("style", ["clean", "abort"])
def test_before_terminal_on_a_json_array_cuts_before_its_closing_bracket_live_as_in_replay(style):
    """The closing ] is no event: with it the turn ends, so before-terminal falls before it."""
    src = gemini_array()
    log = assert_as_replay(src, f"cut:at=before-terminal,style={style}")
    assert not any("not reached" in line for line in log), log
    body, _, _ = live(src, f"cut:at=before-terminal,style={style}", 7)
    assert body == src.body[: src.body.rindex(b"\r\n]")]
    assert analyze_bytes(body, "gemini", wire="json-array").verdict.kind is VerdictKind.TRUNCATED
