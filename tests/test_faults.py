"""The fault catalog, sans-IO: spec parsing, and the plan each fault makes of a stream.

Expected bodies are built independently from the frame lists (slicing, swapping,
re-encoding), and each faulted stream goes through the verdict layer, which must judge it.
"""

from __future__ import annotations

import json
import re

import pytest
from replay_streams import anthropic_frames, bedrock_invoke_frames, openai_chat_frames

from streamtap.providers import analyze_bytes
from streamtap.providers.turn import Dialect, VerdictKind
from streamtap.replay.faults import FaultSpecError, LiveFaults, Timing, parse_fault, parse_faults, plan, protocol_positions
from streamtap.replay.source import Source
from streamtap.wire import EventStreamDecoder, Malformed

OPENAI = openai_chat_frames()
ANTHROPIC = anthropic_frames()
BEDROCK = bedrock_invoke_frames()


def source(kind: str, frames=None, gap_ms: float = 0.0) -> Source:
    wire, dialect, default = {
        "openai": ("sse", "openai-chat", OPENAI),
        "anthropic": ("sse", "anthropic", ANTHROPIC),
        "bedrock": ("eventstream", "bedrock-invoke", BEDROCK),
    }[kind]
    return Source.from_frames(frames or default, wire=wire, dialect=dialect, gap_ms=gap_ms)


def served(kind: str, spec: str, timing: str = "fast", **kw):
    return plan(source(kind), parse_faults(spec), Timing.parse(timing), **kw)


def verdict(kind: str, body: bytes):
    dialect = {"openai": Dialect.OPENAI_CHAT, "anthropic": Dialect.ANTHROPIC, "bedrock": Dialect.BEDROCK_INVOKE}[kind]
    return analyze_bytes(body, dialect).verdict


@pytest.mark.parametrize(
    "spec, message",
    [
        ("explode:now=1", "unknown fault 'explode'"),
        ("cut:event=3,byte=5", "exactly one of"),
        ("cut:style=clean", "exactly one of"),
        ("cut:at=middle", "at is one of"),
        ("cut:event=x", "event must be a number"),
        ("stall:after=3", "needs secs="),
        ("drop:frame=3", "drop takes event"),
        ("corrupt:field=crc,byte=300", "byte must be 0..255"),
        ("error:kind=teapot", "error kind is one of"),
        ("fragment:max=0", "max must be >= 1"),
        ("cut:event", "expected key=value"),
        ("cut:event=3,event=5", "event is given twice"),
        ("stall:after=2,secs=1,secs=9", "secs is given twice"),
        ("cut:event=\u0663", "event must be a number"),  # an Arabic-Indic three
        ("stall:after=1,secs=\uff11", "secs must be a number"),  # a fullwidth one
        # what int() and float() take beyond the grammar (decimal, or hexadecimal after 0x)
        ("cut:event=1_0", "event must be a number"),
        ("cut:event=+5", "event must be a number"),
        ("corrupt:frame=1,field=crc,byte=0x_1a", "byte must be a number"),
        ("stall:after=1,secs=1_0", "secs must be a number"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(FaultSpecError, match=message):
        parse_fault(spec)


def test_specs_parse_hex_bytes_and_join_with_semicolons():
    faults = parse_faults("corrupt:frame=2,field=crc,byte=0x22; stall:after=1,secs=0.5")
    assert [(f.kind, f.params) for f in faults] == [
        ("corrupt", {"frame": 2, "field": "crc", "byte": 0x22}),
        ("stall", {"after": 1, "secs": 0.5}),
    ]


def test_no_fault_serves_the_body_unchanged_and_ends_clean():
    p = served("openai", "")
    assert p.body == b"".join(OPENAI)
    assert p.end.style == "clean" and p.log == []
    assert verdict("openai", p.body).kind is VerdictKind.COMPLETE


@pytest.mark.parametrize("n", [-1, 0, 5, 40, len(OPENAI) - 2])
@pytest.mark.parametrize("style", ["clean", "abort"])
def test_cut_after_event_n(n, style):
    p = served("openai", f"cut:event={n},style={style}")
    assert p.body == b"".join(OPENAI[: n + 1])
    assert p.end.style == style
    assert f"after event {n}" in p.log[0] and f"byte {len(p.body)}" in p.log[0]
    assert verdict("openai", p.body).kind is VerdictKind.TRUNCATED


def test_cut_past_the_last_event_is_an_error():
    with pytest.raises(FaultSpecError, match="does not exist"):
        served("openai", f"cut:event={len(OPENAI)}")


@pytest.mark.parametrize("spec", [f"cut:event={len(OPENAI) - 1}", f"cut:byte={len(b''.join(OPENAI))},style=clean"])
def test_a_cut_at_the_end_in_the_style_the_stream_ends_cuts_nothing_and_is_refused(spec):
    """Else the whole answer would be served marked as a fault, and a test expecting a cut would
    get it; the same cut in another style is a fault (no terminating chunk)."""
    with pytest.raises(FaultSpecError, match="the cut would change nothing"):
        served("openai", spec)
    aborted = served("openai", f"{spec.split(',')[0]},style=abort")
    assert aborted.body == b"".join(OPENAI) and aborted.end.style == "abort"


def test_reordering_the_last_event_is_refused_naming_the_event_asked_for():
    last = len(OPENAI) - 1
    with pytest.raises(FaultSpecError, match=f"event {last} is the last of this stream's {len(OPENAI)} events"):
        served("openai", f"reorder:event={last}")


def test_cut_at_a_byte_offset():
    p = served("anthropic", "cut:byte=1200")
    assert p.body == b"".join(ANTHROPIC)[:1200]
    assert verdict("anthropic", p.body).kind is VerdictKind.TRUNCATED


def test_cut_inside_tool_arguments():
    p = served("openai", "cut:at=tool-args,style=abort")
    last_line = p.body.rsplit(b"\n\n", 1)[-1]
    assert b'"arguments":"' in last_line and not last_line.endswith(b"\n")
    assert json.loads(b"".join(OPENAI).split(b"data: ")[len(p.body.split(b"data: ")) - 1].split(b"\n")[0])  # the cut frame was whole JSON before
    v = verdict("openai", p.body)
    assert v.kind is VerdictKind.TRUNCATED


def test_cut_right_after_an_escaped_quote():
    p = served("openai", "cut:at=escaped-quote")
    assert p.body.endswith(b'\\"')
    assert p.body == b"".join(OPENAI)[: len(p.body)]
    assert verdict("openai", p.body).kind is VerdictKind.TRUNCATED


def test_cut_between_blocks_and_before_terminal():
    between = served("anthropic", "cut:at=between-blocks")
    assert between.body.endswith(b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\nevent: ping\ndata: {"type":"ping"}\n\n')
    before = served("anthropic", "cut:at=before-terminal")
    assert before.body == b"".join(ANTHROPIC[:-1])
    assert verdict("anthropic", before.body).kind is VerdictKind.TRUNCATED
    openai_before = served("openai", "cut:at=before-terminal")
    assert openai_before.body == b"".join(OPENAI[:-1])
    openai_between = served("openai", "cut:at=between-blocks")
    assert b"tool_calls" not in openai_between.body and b"tool_calls" in OPENAI[len(openai_between.body.split(b"\n\n")) - 1]


def test_cut_inside_prelude_and_crc_of_event_stream():
    body = b"".join(BEDROCK)
    starts = [sum(map(len, BEDROCK[:i])) for i in range(len(BEDROCK))]
    prelude = served("bedrock", "cut:at=prelude,event=3")
    assert len(prelude.body) == starts[3] + 6
    crc = served("bedrock", "cut:at=crc,event=3")
    assert len(crc.body) == starts[4] - 2
    assert crc.body == body[: len(crc.body)]
    for p in (prelude, crc):
        assert verdict("bedrock", p.body).kind is VerdictKind.TRUNCATED
    with pytest.raises(FaultSpecError, match="no prelude position"):
        served("openai", "cut:at=prelude")
    # the message picked must be one the stream has, and only prelude and crc pick one
    with pytest.raises(FaultSpecError, match=f"event {len(BEDROCK)} does not exist"):
        served("bedrock", f"cut:at=prelude,event={len(BEDROCK)}")
    with pytest.raises(FaultSpecError, match="first is event 0"):
        served("bedrock", "cut:at=crc,event=-1")
    with pytest.raises(FaultSpecError, match="not of at=tool-args"):
        served("bedrock", "cut:at=tool-args,event=3")
    for spec in ("cut:at=tool-args,event=3", "cut:at=prelude,event=-1"):
        with pytest.raises(FaultSpecError):
            LiveFaults(parse_faults(spec), "eventstream", "bedrock-converse")


def test_protocol_positions_lists_what_each_stream_has():
    names = {name for name, _pos, _what in protocol_positions(source("anthropic"))}
    assert names == {"tool-args", "escaped-quote", "between-blocks", "before-terminal"}
    bedrock = {name for name, _pos, _what in protocol_positions(source("bedrock"))}
    assert {"prelude", "crc", "before-terminal", "tool-args"} <= bedrock


def test_stall_pauses_after_event_n_in_fast_mode():
    p = served("openai", "stall:after=10,secs=95")
    before = [w for w in p.writes if w.at == 0]
    assert b"".join(w.data for w in before) == b"".join(OPENAI[:11])
    assert all(w.at == 95 for w in p.writes[len(before) :])
    assert p.body == b"".join(OPENAI)


def test_a_stall_at_a_byte_the_stream_does_not_have_is_refused():
    body = b"".join(OPENAI)
    at_end = served("openai", f"stall:byte={len(body)},secs=5")  # before the end of the body: a place it has
    assert at_end.body == body and at_end.end.at == 5
    with pytest.raises(FaultSpecError, match=f"byte {len(body) + 1} is past the end"):
        served("openai", f"stall:byte={len(body) + 1},secs=5")


def test_a_stall_past_a_cut_is_not_reached_and_one_at_the_cut_holds_the_end():
    past = served("openai", "cut:event=3; stall:after=10,secs=95")
    assert past.body == b"".join(OPENAI[:4]) and past.end.at == 0 and all(w.at == 0 for w in past.writes)
    assert any("not reached, the stream is cut at byte" in line for line in past.log), past.log
    at_the_cut = served("openai", "stall:after=3,secs=7; cut:event=3")  # hang, then the cut
    assert at_the_cut.body == past.body and at_the_cut.end.at == 7


def test_original_timing_and_scale_follow_the_recorded_gaps():
    src = source("anthropic", gap_ms=10.0)
    original = plan(src, [], Timing.parse("original"))
    assert [round(w.at, 6) for w in original.writes] == [round(i * 0.010, 6) for i in range(len(ANTHROPIC))]
    half = plan(src, [], Timing.parse("scale=0.5"))
    assert half.writes[-1].at == pytest.approx((len(ANTHROPIC) - 1) * 0.005)
    assert plan(src, [], Timing.parse("fast")).end.at == 0


def test_fragment_rechunks_deterministically():
    p = served("anthropic", "fragment:max=3,seed=7")
    assert p.body == b"".join(ANTHROPIC)
    assert max(len(w.data) for w in p.writes) == 3 and min(len(w.data) for w in p.writes) == 1
    assert [w.data for w in served("anthropic", "fragment:max=3,seed=7").writes] == [w.data for w in p.writes]


def test_latency_and_bandwidth_pace_the_writes():
    lat = served("anthropic", "latency:ms=20,jitter=5")
    assert all(0.015 <= w.at <= 0.025 for w in lat.writes)
    assert lat.body == b"".join(ANTHROPIC)
    bw = served("anthropic", "bandwidth:bps=80000")  # 10 000 bytes/s
    total = len(b"".join(ANTHROPIC))
    assert bw.writes[-1].at == pytest.approx((total - len(bw.writes[-1].data)) / 10000, rel=0.01)
    assert max(len(w.data) for w in bw.writes) <= 100


def test_corrupt_a_crc_byte_to_a_quote():
    p = served("bedrock", "corrupt:frame=5,field=crc,byte=0x22")
    body = b"".join(BEDROCK)
    crc_at = sum(map(len, BEDROCK[:6])) - 4
    assert p.body[crc_at] == 0x22 and p.body[:crc_at] == body[:crc_at] and p.body[crc_at + 1 :] == body[crc_at + 1 :]
    assert f"body byte {crc_at}" in p.log[0]
    events = EventStreamDecoder().feed(p.body)
    assert isinstance(events[5], Malformed) and "CRC" in type(events[5].error).__name__ + str(events[5].error)
    assert verdict("bedrock", p.body).kind is VerdictKind.CORRUPT


def test_corrupt_payload_of_an_sse_event_flips_one_byte():
    p = served("openai", "corrupt:frame=4")
    diff = [i for i, (a, b) in enumerate(zip(p.body, b"".join(OPENAI))) if a != b]
    assert len(diff) == 1 and p.body[diff[0]] == b"".join(OPENAI)[diff[0]] ^ 0xFF
    with pytest.raises(FaultSpecError, match="needs an event-stream"):
        served("openai", "corrupt:frame=4,field=crc")
    # a byte that is already there would change nothing: refused, not logged as applied
    with pytest.raises(FaultSpecError, match="already there"):
        served("openai", f"corrupt:frame=4,byte={b''.join(OPENAI)[diff[0]]}")


def test_duplicate_reorder_drop():
    f = OPENAI
    assert served("openai", "duplicate:event=3").body == b"".join(f[:4] + [f[3]] + f[4:])
    assert served("openai", "reorder:event=3").body == b"".join(f[:3] + [f[4], f[3]] + f[5:])
    assert served("openai", "drop:event=3").body == b"".join(f[:3] + f[4:])
    # dropping the stop chunk: [DONE] arrives but no finish_reason: not a complete turn
    dropped = served("openai", f"drop:event={len(f) - 2}")
    assert verdict("openai", dropped.body).kind is not VerdictKind.COMPLETE
    # reordering two tool-argument fragments breaks the arguments
    reordered = served("anthropic", f"reorder:event={len(ANTHROPIC) - 5}")
    assert verdict("anthropic", reordered.body).kind is not VerdictKind.COMPLETE


def test_error_injection_in_each_providers_own_shape():
    anth = served("anthropic", "error:kind=overloaded_error,after=10")
    assert anth.body == b"".join(ANTHROPIC[:11]) + b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    v = verdict("anthropic", anth.body)
    assert v.kind is VerdictKind.ERRORED
    oai = served("openai", "error:kind=openai,after=5")
    assert oai.body.startswith(b"".join(OPENAI[:6]) + b'data: {"error":') and oai.body.endswith(b"data: [DONE]\n\n")
    assert verdict("openai", oai.body).kind is VerdictKind.ERRORED
    bed = served("bedrock", "error:kind=modelStreamErrorException,after=4")
    events = EventStreamDecoder().feed(bed.body)
    assert len(events) == 6 and events[5].headers[":exception-type"] == "modelStreamErrorException"
    assert json.loads(events[5].payload)["originalStatusCode"] == 500
    assert verdict("bedrock", bed.body).kind is VerdictKind.ERRORED
    with pytest.raises(FaultSpecError, match="does not fit an event-stream"):
        served("bedrock", "error:kind=overloaded_error")


def test_swap_tail_stitches_two_generations_and_is_caught():
    other_frames = [fr.replace(b"chatcmpl-T1", b"chatcmpl-T2").replace(b"weather", b"climate") for fr in OPENAI]
    other = source("openai", other_frames)
    p = served("openai", "swap-tail:with=other.jsonl,at=20", others={"other.jsonl": other})
    assert p.body == b"".join(OPENAI[:21] + other_frames[21:])
    v = verdict("openai", p.body)
    assert v.kind is not VerdictKind.COMPLETE, v


def test_resume_serves_only_events_after_the_position():
    p = plan(source("anthropic", gap_ms=10.0), [], Timing.parse("original"), start_after=9)
    assert p.body == b"".join(ANTHROPIC[10:])
    assert p.writes[0].at == pytest.approx(0.010)


@pytest.mark.parametrize(
    "kind, spec",
    [
        ("openai", "cut:event=7,style=abort"),
        ("openai", "cut:at=tool-args"),
        ("openai", "cut:at=escaped-quote"),
        ("openai", "cut:at=before-terminal"),
        ("anthropic", "cut:at=between-blocks"),
        ("anthropic", "cut:byte=999"),
        ("bedrock", "cut:at=crc,event=4"),
        ("bedrock", "cut:at=prelude,event=4"),
        ("openai", "drop:event=3"),
        ("openai", "duplicate:event=3"),
        ("openai", "reorder:event=3"),
        ("bedrock", "corrupt:frame=5,field=crc,byte=0x22"),
        ("anthropic", "error:kind=overloaded_error,after=10"),
        ("bedrock", "error:kind=modelStreamErrorException,after=4"),
    ],
)
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_live_faults_give_the_same_bytes_as_replay_for_any_chunking(kind, spec, chunk):
    from streamtap.replay.faults import LiveFaults

    src = source(kind)
    expected = plan(src, parse_faults(spec))
    live = LiveFaults(parse_faults(spec), src.wire, src.dialect)
    body = src.body
    out = []
    for i in range(0, len(body), chunk):
        out += live.feed(body[i : i + chunk])
    out += live.close()
    assert b"".join(out) == expected.body
    assert (live.end or "clean") == expected.end.style
    # every fault is logged with its exact position: the body byte replay names, however the body came in
    positions = re.compile(r"(?:at|body) byte (\d+)")
    assert [positions.findall(line) for line in live.log] == [positions.findall(line) for line in expected.log]


def test_live_faults_refuse_what_needs_a_recording():
    from streamtap.replay.faults import LiveFaults

    with pytest.raises(FaultSpecError, match="replays only"):
        LiveFaults(parse_faults("stall:after=3,secs=1"), "sse")


def test_of_two_cuts_the_earlier_ends_the_stream_in_its_style_and_the_later_is_not_reached():
    for spec in ("cut:event=2,style=reset; cut:event=5,style=clean", "cut:event=5,style=clean; cut:event=2,style=reset"):
        p = served("openai", spec)
        assert p.body == b"".join(OPENAI[:3]) and p.end.style == "reset", (spec, p.end)
        assert any(line.startswith("cut:event=2,style=reset: reset cut at byte") for line in p.log), p.log
        assert any(line.startswith("cut:event=5,style=clean: not reached") for line in p.log), p.log
        assert not any("clean cut" in line for line in p.log), p.log


def test_an_injected_error_or_a_swapped_tail_sets_how_the_stream_ends():
    cut_short = source("openai")
    cut_short.end_style = "abort"  # recorded when the upstream was reset
    error = plan(cut_short, parse_faults("error:kind=openai,after=2"))
    assert error.body.endswith(b"data: [DONE]\n\n") and error.end.style == "clean"  # the error ended the answer
    whole = source("openai")
    assert plan(whole, parse_faults("swap-tail:with=cut.jsonl,at=3"), others={"cut.jsonl": cut_short}).end.style == "abort"
    assert plan(cut_short, parse_faults("swap-tail:with=whole.jsonl,at=3"), others={"whole.jsonl": whole}).end.style == "clean"
    assert plan(cut_short, parse_faults("drop:event=3")).end.style == "abort"  # the recording's own end stays
