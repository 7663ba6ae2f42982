"""Live fault injection agrees with replay, and says so when it cannot apply.

- Two cuts live: the earliest position ends the stream, at a tie the first in the spec, as in
  replay's ``plan()`` (a tool call's arguments are known only when its block stops, after an
  escaped quote in the same event was found). Compared byte for byte for several chunk sizes.
- A live cut at a position the stream can never have is refused at the start, as replay refuses it.
- ``stall`` with both ``after=`` and ``byte=`` is refused.
- A compressed upstream body (a real ``mitmdump -s addon/tap.py``): event faults are not applied,
  the body streams as it came (bytes reach the client while the upstream is still sending), and
  the log says why; byte-only faults still work on the compressed bytes.
"""

from __future__ import annotations

import gzip
import json
import zlib

import httpx
import pytest
from replay_streams import anthropic_frames, bedrock_invoke_frames, openai_chat_frames
from upstream import Mitmdump, Script, Upstream
from test_live_faults_order import live  # (the constructed sources here end clean, as it takes them)

from streamtap.replay.faults import FaultSpecError, LiveFaults, parse_fault, parse_faults, plan
from streamtap.replay.source import Source

CHUNKS = (1, 7, 64, 10**9)
ANTHROPIC = Source.from_frames(anthropic_frames(words=6), wire="sse", dialect="anthropic")
# one Gemini event that ends the turn: before-terminal falls at byte 0, where cut:event=-1 does
GEMINI_ONE = Source.from_frames(
    [b"data: " + json.dumps({"candidates": [{"content": {"parts": [{"text": "Paris"}], "role": "model"}, "finishReason": "STOP", "index": 0}],
                             "usageMetadata": {"promptTokenCount": 6, "candidatesTokenCount": 1, "totalTokenCount": 7}}).encode() + b"\r\n\r\n"],
    wire="sse", dialect="gemini",
)
BEDROCK = Source.from_frames(bedrock_invoke_frames(words=5), wire="eventstream", dialect="bedrock-invoke")




@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize(
    ("source", "spec", "winner"),
    [
        # the escaped quote is 2 bytes past the first argument byte, in the same event; the arguments are known later
        (ANTHROPIC, "cut:at=tool-args,style=abort;cut:at=escaped-quote,style=reset", "cut:at=tool-args,style=abort"),
        (ANTHROPIC, "cut:at=escaped-quote,style=reset;cut:at=tool-args,style=clean", "cut:at=tool-args,style=clean"),
        (ANTHROPIC, "cut:at=escaped-quote,style=abort;cut:at=tool-args,style=clean;cut:event=17,style=reset", "cut:at=tool-args,style=clean"),
        # a tie at byte 0 goes to the first in the spec, whichever kind it is
        (GEMINI_ONE, "cut:at=before-terminal,style=clean;cut:event=-1,style=reset", "cut:at=before-terminal,style=clean"),
        (GEMINI_ONE, "cut:event=-1,style=reset;cut:at=before-terminal,style=clean", "cut:event=-1,style=reset"),
    ],
)
def test_the_earliest_of_several_live_cuts_ends_the_stream_as_in_replay(source, spec, winner, chunk):
    expected = plan(source, parse_faults(spec))
    body, end, log = live(source, spec, chunk)
    assert (body, end) == (expected.body, expected.end.style)
    assert sorted(log) == sorted(expected.log)  # the same winner at the same byte; the others "not reached"
    assert any(line.startswith(f"{winner}: ") and " cut at byte " in line for line in log)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize(
    ("source", "spec"),
    [
        (ANTHROPIC, "cut:at=between-blocks,style=abort;cut:at=escaped-quote,style=clean"),
        (ANTHROPIC, "cut:event=16,style=abort;cut:at=tool-args,style=reset"),
        (ANTHROPIC, "cut:at=tool-args,style=reset;cut:event=15,style=abort"),
        (ANTHROPIC, "drop:event=3;cut:at=escaped-quote,style=reset;cut:at=tool-args,style=abort"),
        (BEDROCK, "cut:at=crc,event=9,style=abort;cut:at=tool-args,style=reset"),
        (BEDROCK, "cut:at=tool-args,style=clean;cut:at=prelude,event=9,style=abort"),
    ],
)
def test_live_cuts_match_replay_byte_for_byte(source, spec, chunk):
    expected = plan(source, parse_faults(spec))
    body, end, log = live(source, spec, chunk)
    assert (body, end) == (expected.body, expected.end.style)
    assert sorted(_cut_lines(log)) == sorted(_cut_lines(expected.log))


def _cut_lines(log: list[str]) -> list[str]:
    return [line for line in log if line.startswith("cut:")]


@pytest.mark.parametrize(
    ("spec", "wire", "dialect", "name"),
    [
        ("cut:at=prelude,event=0,style=abort", "sse", "openai-chat", "prelude"),
        ("cut:at=crc,event=1", "ndjson", "ollama", "crc"),
        ("cut:at=tool-args", "sse", "unknown", "tool-args"),
        ("cut:at=between-blocks,style=abort", "sse", "unknown", "between-blocks"),
        ("cut:at=before-terminal", "ndjson", "unknown", "before-terminal"),
        ("cut:at=tool-args", "eventstream", "unknown", "tool-args"),
    ],
)
def test_a_live_cut_at_a_position_the_stream_can_never_have_is_refused_at_the_start(spec, wire, dialect, name):
    with pytest.raises(FaultSpecError, match=f"this {wire} stream has no {name} position"):
        LiveFaults(parse_faults(spec), wire, dialect)
    source = Source.from_frames(openai_chat_frames(words=8), wire="sse", dialect=dialect) if wire == "sse" else None
    if source is not None:  # replay refuses the same spec on such a recording, in the same words
        with pytest.raises(FaultSpecError, match=f"this sse recording has no {name} position"):
            plan(source, parse_faults(spec))


def test_live_cuts_that_can_apply_are_still_accepted():
    LiveFaults(parse_faults("cut:at=prelude,event=0;cut:at=crc,event=1"), "eventstream", "bedrock-invoke")
    LiveFaults(parse_faults("cut:at=escaped-quote"), "sse", "unknown")
    LiveFaults(parse_faults("cut:at=tool-args;cut:at=before-terminal;cut:at=between-blocks"), "sse", "anthropic")


def test_a_stall_given_both_after_and_byte_is_refused():
    with pytest.raises(FaultSpecError, match="stall takes after= or byte=, not both"):
        parse_fault("stall:after=3,byte=100,secs=5")
    assert parse_fault("stall:after=3,secs=5").params == {"after": 3, "secs": 5.0}
    assert parse_fault("stall:byte=100,secs=5").params == {"byte": 100, "secs": 5.0}


# --- a compressed upstream body, through mitmdump ---------------------------------------------

LIVE = b"".join(b'data: {"i": %d, "text": "%s"}\n\n' % (i, b"abcdefghij"[i % 10 :] * 3) for i in range(40))
ENCODE = {"gzip": lambda body: gzip.compress(body, mtime=0), "deflate": zlib.compress}
DECODE = {"gzip": gzip.decompress, "deflate": zlib.decompress}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    work = tmp_path_factory.mktemp("faults-compressed")
    with Upstream() as upstream:
        with Mitmdump(upstream.url, work / "mitm", options={"streamtap_fault_header": "true"}) as mitm:
            yield upstream, mitm


def _flow_lines(mitm: Mitmdump, text: str) -> list[str]:
    return [line for line in mitm.log().splitlines() if text in line]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_event_faults_leave_a_compressed_body_streaming_untouched_and_say_why(proxy, encoding):
    upstream, mitm = proxy
    name = f"held-{encoding}"
    wire = ENCODE[encoding](LIVE)
    upstream.arm_pause()
    upstream.add(name, Script(LIVE, encoding=encoding, chunk_size=16, pause_after=32))
    spec = "cut:event=5,style=clean"
    with httpx.Client(timeout=5) as client:
        with client.stream("POST", f"{mitm.url}/s/{name}/x", content=b"{}",
                           headers={"accept-encoding": encoding, "x-streamtap-fault": spec}) as response:
            raw = response.iter_raw()
            try:
                assert upstream.wait_paused()
                first = next(raw)  # the upstream is still sending: the bytes so far reach the client now
            finally:
                upstream.release()
            got = first + b"".join(raw)
    assert response.headers["content-encoding"] == encoding
    assert first and wire.startswith(first)
    assert got == wire and DECODE[encoding](got) == LIVE  # the whole body, uncut, as it came
    line = mitm.wait_log(f"the body is {encoding}-encoded")
    assert f"fault not applied: {spec}: the body is {encoding}-encoded; event faults need an identity body" in line
    assert not _flow_lines(mitm, "not reached")


def test_byte_faults_still_work_on_a_compressed_body(proxy):
    upstream, mitm = proxy
    wire = gzip.compress(LIVE, mtime=0)
    upstream.add("bytes-gzip", Script(LIVE, encoding="gzip", chunk_size=40))
    response = httpx.post(f"{mitm.url}/s/bytes-gzip/x", content=b"{}", timeout=10,
                          headers={"accept-encoding": "gzip", "x-streamtap-fault": "fragment:max=3,seed=1"})
    assert response.content == LIVE and response.headers["content-encoding"] == "gzip"
    line = mitm.wait_log("fault fragment:max=3,seed=1: ")
    assert "writes of 1..3 bytes" in line
    assert not _flow_lines(mitm, "fault not applied: fragment")
    assert len(wire) > 3


def _late_arguments() -> list[bytes]:
    """A chat answer whose tool call opens, then streams its arguments 30 chunks later."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    frames = openai_chat_frames(words=3, tool=False)[:-2]
    frames.append(chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}))
    frames += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]})] * 30
    frames += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}), chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
    return frames


def test_a_cut_at_an_events_start_does_not_wait_for_the_arguments_inside_it():
    """between-blocks falls where the tool call's event starts; tool-args can only fall later in
    it, so the stream ends there and then, not once the arguments are known."""
    frames = _late_arguments()
    spec = "cut:at=between-blocks;cut:at=tool-args"
    faults = LiveFaults(parse_faults(spec), "sse", "openai-chat")
    out, ended_at = [], None
    for i, frame in enumerate(frames):
        out += faults.feed(frame)
        if faults.end is not None and ended_at is None:
            ended_at = i
    out += faults.close()
    assert b"".join(out) == plan(Source.from_frames(frames, wire="sse", dialect="openai-chat"), parse_faults(spec)).body
    assert ended_at == len(openai_chat_frames(words=3, tool=False)) - 2  # the tool call's own event
