"""The proxy path's batching (several network reads decoded in one pass) changes nothing a reader sees.

mitmdump hands the Tap every HTTP chunk of one socket read in one event-loop turn; the Tap
analyses them together afterwards. These tests feed the same bodies read by read and in
batches and compare the recordings line by line, and check each frame's time is the arrival
of the read that brought its last byte.
"""

from __future__ import annotations

import json
import random

import orjson
import pytest
from mitmproxy.test import tflow

import provider_streams as streams
from streamtap.mitm.flowtap import FlowTap
from streamtap.providers import Dialect, StreamEnd, StreamSession
from streamtap.providers.judge import TEXT_BATCH


class TurnLoop:
    """Collects the Tap's deferred analysis callbacks; ``run`` is one event-loop turn."""

    def __init__(self) -> None:
        self.callbacks = []

    def call_soon(self, callback) -> None:
        self.callbacks.append(callback)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


def flow_for(path: str, content_type: str):
    f = tflow.tflow(resp=True)
    f.request.method, f.request.path = "POST", path
    f.request.content = b'{"model":"m","stream":true,"messages":[]}'
    f.response.headers["content-type"] = content_type
    f.response.content = None
    return f


def cut(body: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(body):
        n = rng.choice([1, 7, 40, 200, 1000, 5000])
        chunks.append(body[i : i + n])
        i += n
    return chunks


def record(tmp_path, name: str, path: str, content_type: str, chunks: list[bytes], reads_per_turn: int | None,
           end: StreamEnd = StreamEnd.FINISHED) -> list[dict]:
    directory = tmp_path / name
    tap = FlowTap(flow_for(path, content_type), directory=str(directory), fsync="end", redact=(), sentinel=None,
                  max_event_size=1 << 20, record=True)
    loop = TurnLoop() if reads_per_turn else None
    for i, chunk in enumerate(chunks, 1):
        tap.arrived(chunk, loop)
        if loop is not None and i % reads_per_turn == 0:
            loop.run()
    if loop is not None:
        loop.run()
    summary = tap.finish(end)
    assert not summary["errors"]
    return [orjson.loads(line) for line in open(summary["recording"], "rb")]


def without_times(lines: list[dict]) -> list[dict]:
    out = []
    for line in lines:
        line = dict(line)
        line.pop("t", None)
        if line["type"] == "header":
            continue
        if line["type"] == "reads":
            line["reads"] = [r[:2] for r in line["reads"]]
        if line["type"] == "end":
            for key in ("duration_ms", "ttft_ms"):
                line.pop(key)
            line["turn"].pop("timing")
        out.append(line)
    return out


def check_frame_times(lines: list[dict]) -> int:
    """Every frame's t is the arrival of the read holding its last byte; returns the frames checked."""
    reads = [r for line in lines if line["type"] == "reads" for r in line["reads"]]
    frames = [line for line in lines if line["type"] == "frame"]
    for frame in frames:
        last = frame["offset"] + frame["len"] - 1
        read = next(r for r in reads if r[0] <= last < r[0] + r[1])
        assert frame["t"] == read[2], (frame["seq"], frame["t"], read)
    return len(frames)


BODIES = {
    "openai-chat": ("/v1/chat/completions", "text/event-stream", streams.openai_chat([f"w{i} " for i in range(700)])),
    "cut-sse": ("/v1/chat/completions", "text/event-stream", streams.openai_chat([f"w{i} " for i in range(300)])[:-40]),
    "converse": ("/model/m/converse-stream", "application/vnd.amazon.eventstream",
                 streams.bedrock_converse([f"w{i} " for i in range(400)], {"city": "Paris"})),
    "anthropic": ("/v1/messages", "text/event-stream", streams.anthropic("think " * 50, "text " * 300, {"q": 1})),
}


@pytest.mark.parametrize("name", list(BODIES))
@pytest.mark.parametrize("seed, reads_per_turn", [(1, 50), (2, 10_000)])  # 10_000: whole bodies, several 64 KiB groups
def test_batched_reads_record_the_same_lines(tmp_path, name, seed, reads_per_turn):
    path, content_type, body = BODIES[name]
    chunks = cut(body, seed)
    alone = record(tmp_path, "alone", path, content_type, chunks, None)
    batched = record(tmp_path, "batched", path, content_type, chunks, reads_per_turn)
    assert without_times(batched) == without_times(alone)
    assert check_frame_times(batched) > 10
    if content_type != "text/event-stream" or name == "openai-chat":  # no look-ahead in these decoders
        check_frame_times(alone)
    assert sum(1 for line in batched if line["type"] == "tail") == (1 if name.startswith("cut") else 0)


def test_feed_reads_matches_feeding_read_by_read():
    body = streams.openai_chat([f"w{i} " for i in range(TEXT_BATCH * 3)])
    chunks = cut(body, 3)
    times = [i / 1000 for i in range(len(chunks))]
    one = StreamSession(Dialect.OPENAI_CHAT, "sse")
    events_one = [e for chunk, t in zip(chunks, times) for e in one.feed(chunk, t)]
    many = StreamSession(Dialect.OPENAI_CHAT, "sse")
    events_many, brought_by = [], []
    for start in range(0, len(chunks), 17):
        events, reads = many.feed_reads(chunks[start : start + 17], times[start : start + 17])
        events_many += events
        brought_by += [start + r for r in reads]
    assert [(e.seq, e.start, e.raw) for e in events_many] == [(e.seq, e.start, e.raw) for e in events_one]
    ends = [sum(map(len, chunks[: i + 1])) for i in range(len(chunks))]
    for event, read in zip(events_many, brought_by):
        assert (ends[read - 1] if read else 0) <= event.end - 1 < ends[read]
    a, b = one.close(), many.close()
    assert a.turn.to_dict() == b.turn.to_dict()  # arrivals included: each event timed by its last byte's read
    assert a.verdict.to_dict() == b.verdict.to_dict()
    assert a.turn.text() == "".join(f"w{i} " for i in range(TEXT_BATCH * 3))


def test_live_sessions_keep_no_per_event_times():
    body = streams.openai_chat([f"w{i} " for i in range(500)])
    session = StreamSession(Dialect.OPENAI_CHAT, "sse", keep_arrivals=False)
    session.feed(body[:1000], 0.5)
    session.feed(body[1000:], 0.75)
    analysis = session.close()
    timing = analysis.turn.timing
    assert timing.arrivals == [] and (timing.first_byte, timing.last_byte) == (0.5, 0.75)
    assert timing.first_content == 0.5 and analysis.verdict.kind == "complete"


def test_text_fragments_kept_exact_across_blocks_and_batches():
    """Fragments are joined lazily; switching blocks (text, thinking, text again) keeps each exact."""
    base = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}

    def chunk(delta, finish=None):
        return b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    first = [f"a{i}" for i in range(TEXT_BATCH + 5)]
    thinking = [f"r{i}" for i in range(TEXT_BATCH * 2)]
    second = [f"b{i}" for i in range(3)]
    body = b"".join(
        [chunk({"content": p}) for p in first]
        + [chunk({"reasoning_content": p}) for p in thinking]
        + [chunk({"content": p}) for p in second]
        + [chunk({}, "stop"), b"data: [DONE]\n\n"]
    )
    session = StreamSession(Dialect.OPENAI_CHAT, "sse")
    session.feed(body, 0.0)
    turn = session.close().turn
    assert [(b.kind, b.text) for b in turn.blocks] == [
        ("text", "".join(first)), ("thinking", "".join(thinking)), ("text", "".join(second))
    ]


def test_tool_arguments_kept_exact_across_fragments():
    """Argument fragments are joined lazily too, and a second call's fragments stay its own."""
    base = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}

    def chunk(delta, finish=None):
        return b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    def call(position, fragments, call_id):
        first = {"tool_calls": [{"index": position, "id": call_id, "type": "function", "function": {"name": "f", "arguments": ""}}]}
        return [chunk(first)] + [chunk({"tool_calls": [{"index": position, "function": {"arguments": f}}]}) for f in fragments]

    one = json.dumps({"text": "".join(f"x{i}" for i in range(TEXT_BATCH * 2))})
    two = json.dumps({"n": 2})
    body = b"".join(
        [chunk({"content": "calling"})]
        + call(0, [one[i : i + 3] for i in range(0, len(one), 3)], "call_1")
        + call(1, list(two), "call_2")
        + [chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
    )
    session = StreamSession(Dialect.OPENAI_CHAT, "sse")
    session.feed(body, 0.0)
    analysis = session.close()
    calls = analysis.turn.tool_calls()
    assert [(c.id, c.arguments_raw, c.arguments) for c in calls] == [
        ("call_1", one, json.loads(one)), ("call_2", two, {"n": 2})
    ]
    assert analysis.turn.text() == "calling" and analysis.verdict.kind == "complete"


def test_anthropic_long_text_block_is_exact():
    from streamtap.providers.judge import TEXT_BATCH as PIECES_BATCH

    pieces = [f"t{i} " for i in range(PIECES_BATCH * 2 + 7)]
    events = [e for e in streams.anthropic_events("hmm", "", {"q": 1})]
    at = next(i for i, e in enumerate(events) if e.get("delta", {}).get("type") == "text_delta")
    events[at : at + 1] = [{"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": p}} for p in pieces]
    body = b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in events)
    session = StreamSession(Dialect.ANTHROPIC, "sse")
    for i in range(0, len(body), 999):
        session.feed(body[i : i + 999], 0.0)
    analysis = session.close()
    assert analysis.turn.text() == "".join(pieces) and analysis.verdict.kind == "complete"


def test_analysis_failing_mid_batch_still_records_every_byte(tmp_path):
    """Fail open on the batched path: when the session breaks, the bytes it held and every later
    read are still recorded (as raw), so the body rebuilds byte-exact."""
    from streamtap.recording import read_recording

    path, content_type, body = BODIES["openai-chat"]
    chunks = cut(body, 5)
    tap = FlowTap(flow_for(path, content_type), directory=str(tmp_path), fsync="end", redact=(), sentinel=None,
                  max_event_size=1 << 20, record=True)
    loop = TurnLoop()
    half = len(chunks) // 2
    for chunk in chunks[:half]:
        tap.arrived(chunk, loop)
    loop.run()
    assert tap.unframed  # an event in progress is held

    def broken(chunks, times):
        raise RuntimeError("injected")

    tap.session.feed_reads = broken
    for i, chunk in enumerate(chunks[half:], 1):
        tap.arrived(chunk, loop)
        if i % 20 == 0:
            loop.run()
    loop.run()
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "unknown" and len(summary["errors"]) == 1 and "injected" in summary["errors"][0]
    recording = read_recording(summary["recording"])
    assert recording.body == body and recording.end is not None


def test_a_flow_whose_analysis_fails_still_counts_its_bytes_as_its_recording_does(tmp_path):
    """A bug in the analysis switches it off for the flow: the log line and the metrics take the
    summary's count, and it must be the bytes the recording holds, not 0."""
    body = streams.openai_chat(["a ", "b ", "c"])
    tap = FlowTap(flow_for("/v1/chat/completions", "text/event-stream"), directory=str(tmp_path), fsync="end",
                  redact=(), sentinel=None, max_event_size=1 << 20, record=True)
    tap.arrived(body[:50], None)

    def broken(*args, **kwargs):  # stands in for a bug in streamtap's analysis
        raise RuntimeError("a bug")

    tap.session.feed = broken
    tap.arrived(body[50:], None)
    summary = tap.finish(StreamEnd.FINISHED)
    end = orjson.loads(open(summary["recording"], "rb").read().splitlines()[-1])
    assert summary["verdict"] == "unknown" and summary["errors"]
    assert summary["bytes"] == end["bytes"] == len(body), (summary["bytes"], end.get("bytes"))


def test_the_memory_a_recorded_flow_leaves_behind_does_not_grow_with_the_flows(tmp_path):
    """CPython 3.12 before 3.12.6 interns every part of every pathlib path it parses, for good:
    each recording's own names made into Paths stayed in the worker, 200-400 bytes a flow (a
    soak of 14,000 flows grew the worker by 5 MB). The per-flow names are text now."""
    import gc
    import os
    import tracemalloc

    body = streams.openai_chat(["Paris ", "is ", "sunny."])

    def flows(count: int) -> None:
        for _ in range(count):
            tap = FlowTap(flow_for("/v1/chat/completions", "text/event-stream"), directory=str(tmp_path), fsync="never",
                          redact=(), sentinel=None, max_event_size=1 << 20, record=True)
            tap.arrived(body, None)
            summary = tap.finish(StreamEnd.FINISHED)
            os.unlink(summary["recording"])

    flows(200)  # caches filled
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        flows(1000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 30 * 1000, grown  # (bytes: each flow left 200-400 before)
