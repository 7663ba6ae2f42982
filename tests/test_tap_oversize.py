"""An event longer than ``streamtap_max_event``: the Tap's memory stays bounded and the recording
stays whole.

The decoders skip such an event without keeping its bytes. The Tap records them as ``raw`` lines
(in whole lines of the limit from the event's start, as the event in progress outgrows it), then the decoder's report of the
skipped event as a frame with no bytes. The recording still rebuilds the body byte for byte,
checks out against itself and is finished, read by read or batched as on the proxy.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import provider_streams as streams
from streamtap.mitm.flowtap import FlowTap
from streamtap.providers import StreamEnd
from streamtap.recording import check_recording, read_recording
from test_tap_batching import TurnLoop, flow_for
from upstream import CHAT as CHAT_PATH
from upstream import Mitmdump, Script, Upstream, curl, find_recording

STREAMTAP = Path(sys.executable).with_name("streamtap")

LIMIT = 4096
CHAT = "/v1/chat/completions", "text/event-stream"
CONVERSE = "/model/m/converse-stream", "application/vnd.amazon.eventstream"


def chat_with(big: bytes, *, cut: bool = False) -> bytes:
    """An OpenAI chat stream with ``big`` (bytes of one SSE event, or its unfinished start) in the middle,
    or at the end when ``cut``."""
    body = streams.openai_chat([f"w{i} " for i in range(60)])
    middle = body.index(b"\n\n", len(body) // 2) + 2
    return body + big if cut else body[:middle] + big + body[middle:]


BODIES = {
    "one long data line": (CHAT, chat_with(b"data: " + b"x" * 50_000 + b"\n\n")),
    "many lines in one event": (CHAT, chat_with(b"".join(b"data: %05d\n" % i for i in range(9000)) + b"\n")),
    "long comments before an event": (CHAT, chat_with(b": keep-alive\n" * 4000)),
    "cut inside the long event": (CHAT, chat_with(b"data: " + b"y" * 30_000, cut=True)),
    "event-stream, garbage after a good message": (
        CONVERSE, streams.bedrock_converse(["a", "b"], None) + bytes(random.Random(3).randbytes(40_000))
    ),
}


def run(tmp_path, route, body: bytes, sizes: list[int], reads_per_turn: int | None):
    (path, content_type) = route
    tap = FlowTap(flow_for(path, content_type), directory=str(tmp_path), fsync="end", redact=(), sentinel=None,
                  max_event_size=LIMIT, record=True)
    loop = TurnLoop() if reads_per_turn else None
    held, i, reads = 0, 0, 0
    while i < len(body):
        chunk = body[i : i + sizes[reads % len(sizes)]]
        i += len(chunk)
        reads += 1
        tap.arrived(chunk, loop)
        if loop is not None and reads % reads_per_turn == 0:
            loop.run()
        held = max(held, len(tap.unframed))
    if loop is not None:
        loop.run()
    return tap.finish(StreamEnd.FINISHED), held


@pytest.mark.parametrize("name", list(BODIES))
@pytest.mark.parametrize("reads_per_turn", [None, 7])
def test_an_oversize_event_is_recorded_whole_in_bounded_memory(tmp_path, name, reads_per_turn):
    route, body = BODIES[name]
    sizes = [1, 300, 4000, 9000, 17]
    summary, held = run(tmp_path, route, body, sizes, reads_per_turn)
    assert not summary["errors"], summary["errors"]
    assert not summary["recording"].endswith(".partial"), summary["recording"]
    recording = read_recording(summary["recording"])
    assert recording.body == body
    assert check_recording(recording) == []
    assert any(s.kind == "raw" for s in recording.segments)  # the skipped bytes, kept unframed
    # what the Tap holds: at most the limit plus what one analysis pass brings (7 reads when batched)
    assert held <= LIMIT + max(sizes) * (reads_per_turn or 1)
    if name == "long comments before an event":  # keep-alives alone, which the SSE rules skip: nothing is wrong
        assert summary["verdict"] == "complete", summary
        assert "comments or blank lines alone, which the next line would take past the 4096-byte limit" in " ".join(recording.end["turn"]["notes"])
    else:
        assert summary["verdict"] != "complete"


@pytest.mark.parametrize("name", list(BODIES))
def test_an_oversize_event_is_recorded_in_the_same_lines_for_any_reads(tmp_path, name):
    """The bytes held were spilled whenever a read took them past the limit, so the raw lines and
    the tail were cut where the reads ended (one read: a raw line of 271 bytes and an empty tail;
    1-byte reads: a raw line of 1 byte and a tail of 270). They are now cut in whole lines of the
    limit from the event's start."""
    route, body = BODIES[name]
    layouts = set()
    for number, sizes in enumerate(([len(body)], [1], [300, 4000, 9000, 17])):
        summary, _ = run(tmp_path / str(number), route, body, sizes, None)
        recording = read_recording(summary["recording"])
        layouts.add(tuple((s.kind, s.offset, len(s.raw)) for s in recording.segments))
    assert len(layouts) == 1, layouts


def test_a_stream_within_the_limit_has_no_raw_lines(tmp_path):
    body = streams.openai_chat([f"w{i} " for i in range(60)])
    summary, _ = run(tmp_path, CHAT, body, [1, 300, 4000], 7)
    recording = read_recording(summary["recording"])
    assert recording.body == body and summary["verdict"] == "complete"
    assert [s.kind for s in recording.segments] == ["frame"] * len(recording.segments)


@pytest.mark.parametrize("workers", ["1", "0"])
def test_through_mitmdump_an_oversize_event_leaves_a_finished_recording_of_every_byte(tmp_path, workers):
    body = chat_with(b"data: " + b"z" * 300_000 + b"\n\n")
    with Upstream() as up:
        up.add("huge", Script(body, chunk_size=16384))
        options = {"streamtap_max_event": "65536", "streamtap_workers": workers}
        with Mitmdump(up.url, tmp_path / "m", options=options) as proxy:
            assert curl(f"{proxy.url}/s/huge{CHAT_PATH}", max_time=20).stdout == body
            recording = find_recording(proxy.record_dir, "huge")
    assert recording.body == body
    assert check_recording(recording) == []
    assert recording.verdict["kind"] != "complete"
    assert not [n for n in recording.notes if n.get("kind") == "streamtap_error"], recording.notes
    # the header keeps the limit the proxy judged with, and verify judges with it again
    assert recording.header["max_event_size"] == 65536
    verified = subprocess.run([str(STREAMTAP), "verify", "--json", recording.path], capture_output=True, text=True, timeout=60)
    [line] = verified.stdout.splitlines()
    assert json.loads(line)["verdict"]["kind"] == recording.verdict["kind"], line
    assert "judging its bytes again" not in verified.stdout + verified.stderr, verified.stdout


def test_a_decoded_read_larger_than_the_limit_is_kept_in_lines_no_longer_than_it(tmp_path):
    (path, content_type), body = BODIES["one long data line"]
    flow = flow_for(path, content_type)
    flow.response.headers["content-encoding"] = "gzip"
    tap = FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=LIMIT, record=True)
    tap.arrived(gzip.compress(body), None)  # one read that decodes to 12 times the limit
    summary = tap.finish(StreamEnd.FINISHED)
    recording = read_recording(summary["recording"])
    assert recording.body == body and check_recording(recording) == []
    raw = [s for s in recording.segments if s.kind == "raw"]
    assert len(raw) > 10 and all(len(s.raw) <= LIMIT for s in raw)


def test_tool_arguments_nested_deeper_than_orjson_writes_still_end_the_recording(tmp_path):
    """orjson reads 1024 levels but writes 255: a call's arguments 300 levels deep parse, and the
    end line that carries them parsed was never written (the recording stayed partial)."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    arguments = '{"a":' * 300 + "1" + "}" * 300
    call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "w", "arguments": arguments}}
    body = chunk({"role": "assistant"}) + chunk({"tool_calls": [call]}) + chunk({}, "tool_calls") + b"data: [DONE]\n\n"
    tap = FlowTap(flow_for(*CHAT), directory=str(tmp_path), fsync="end", redact=(), sentinel=None,
                  max_event_size=1 << 20, record=True)  # fmt: skip
    tap.arrived(body, None)
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "complete" and not summary.get("errors"), summary
    recording = read_recording(summary["recording"])
    assert recording.complete_file and recording.verdict["kind"] == "complete"
    assert recording.end["turn"]["choices"][0]["blocks"][0]["arguments_raw"] == arguments
    result = subprocess.run([sys.executable, "-m", "streamtap", "verify", summary["recording"]], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_tiny_limit_records_an_oversize_event_in_lines_of_a_floor_not_one_per_byte(tmp_path):
    """streamtap_max_event=1 turned an 800 KB answer into 149 MB of raw lines, one per byte. Lines
    now hold at least MIN_RAW_LINE bytes; the body still rebuilds byte for byte."""
    from streamtap.mitm.flowtap import MIN_RAW_LINE

    body = chat_with(b"data: " + b"x" * 50_000 + b"\n\n")
    tap = FlowTap(flow_for(*CHAT), directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1, record=True)
    for at in range(0, len(body), 1000):
        tap.arrived(body[at : at + 1000], None)
    summary = tap.finish(StreamEnd.FINISHED)
    recording = read_recording(summary["recording"])
    assert recording.body == body and check_recording(recording) == []
    raw = [s for s in recording.segments if s.kind == "raw"]
    # every event is over a 1-byte limit: a line or more of its own each, never one per byte
    assert raw and all(len(s.raw) <= MIN_RAW_LINE for s in raw) and len(raw) <= len(body) // MIN_RAW_LINE + body.count(b"\n\n")
    assert Path(summary["recording"]).stat().st_size < 3 * len(body)
