"""Replay keeps the wait between the last recorded read and the body's end (the end line's
duration_ms) in its timed modes, and refuses a fault plan too large to build (too many writes)
or too long to serve (more than a week)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from replay_streams import OPENAI_REQUEST, dechunk, openai_chat_frames

from streamtap.replay.faults import MAX_PLAN_WRITES, FaultSpecError, Timing, parse_faults, plan
from streamtap.replay.match import Library
from streamtap.replay.server import FAULT_HEADER, ServeOptions, ServerThread
from streamtap.replay.source import load_source

OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()
LATE_END_MS = 1500.0  # the recorded body ended this long after the response started


def _write(path: Path, frames: list[bytes], *, gap_ms: float, end: dict) -> Path:
    """A recording of ``frames``, one read each ``gap_ms`` apart, with the end line ``end``."""
    from streamtap.recording import RecordingWriter
    from streamtap.wire import SSEDecoder

    writer = RecordingWriter(path)
    writer.header(
        {
            "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions",
                        "headers": [["content-type", "application/json"]], "body": OPENAI_REQUEST},
            "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
            "dialect": "openai_chat",
            "wire": {"format": "sse", "content_encoding": None},
        }
    )
    decoder = SSEDecoder()
    for i, raw in enumerate(frames):
        writer.read(raw, i * gap_ms)
        for event in decoder.feed(raw):
            writer.frame(event, i * gap_ms)
    writer.finish(end)
    return path


def _late_end(tmp_path: Path, stream_end: str = "finished") -> Path:
    """Every event within 10 ms, the body's end (terminator or reset) 1.5 s later."""
    return _write(tmp_path / "late-end.jsonl", openai_chat_frames(words=3, tool=False), gap_ms=1.0,
                  end={"stream_end": stream_end, "duration_ms": LATE_END_MS})


def _timed_exchange(base_url: str) -> tuple[bytes, str, float, float]:
    """One request on a raw socket: (what came, how it ended, when the last body data came, when it ended)."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(OPENAI_BODY)}\r\n\r\n".encode() + OPENAI_BODY
        )
        data, last_data = b"", 0.0
        while True:
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                return data, "reset", last_data, time.monotonic() - start
            if not piece:
                return data, "fin", last_data, time.monotonic() - start
            data += piece
            if data.endswith(b"\r\n0\r\n\r\n"):
                return data, "complete", last_data, time.monotonic() - start
            last_data = time.monotonic() - start


def test_original_timing_holds_the_chunked_terminator_until_the_recorded_end(tmp_path):
    _late_end(tmp_path)
    frames = openai_chat_frames(words=3, tool=False)
    with ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("original"))) as server:
        data, how, last_data, ended = _timed_exchange(server.base_url)
    chunks, terminated = dechunk(data)
    assert how == "complete" and terminated and b"".join(chunks) == b"".join(frames)
    assert last_data < 1.0, last_data  # the events come as recorded, at once
    assert ended >= LATE_END_MS / 1000 - 0.005, ended  # the end as recorded: never early


def test_original_timing_does_not_fall_behind_over_many_gaps_longer_than_the_watched_wait(tmp_path):
    """A gap over WATCH_LONGER_THAN counts from when the client took the bytes before it. Seeing
    that a client that keeps up took them costs a poll (2 ms at least) after each write, and the
    schedule moved by it every time: over 60 gaps of 60 ms, 30-60 ms here, 200 ms through the openai SDK."""
    gaps, gap_ms = 60, 60.0
    frames = openai_chat_frames(words=gaps - 2, tool=False)  # with the role, the finish and [DONE]: gaps + 1
    assert len(frames) == gaps + 1
    _write(tmp_path / "gaps.jsonl", frames, gap_ms=gap_ms, end={"stream_end": "finished", "duration_ms": gaps * gap_ms})
    with ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("original"))) as server:
        data, how, _last_data, ended = _timed_exchange(server.base_url)
    assert how == "complete" and b"".join(dechunk(data)[0]) == b"".join(frames)
    late_ms = ended * 1000 - gaps * gap_ms  # the last frame and the terminator leave together
    assert -5 < late_ms < 20, late_ms  # (0.5-1 ms a gap before: 30-60 ms)


def test_original_timing_holds_a_recorded_reset_until_the_recorded_end(tmp_path):
    _late_end(tmp_path, stream_end="upstream_reset")
    with ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("original"))) as server:
        data, how, _last_data, ended = _timed_exchange(server.base_url)
    assert how == "fin" and not dechunk(data)[1]  # the body left unterminated, as the upstream did
    assert ended >= LATE_END_MS / 1000 - 0.005, ended


def test_fast_timing_does_not_wait_for_the_recorded_end(tmp_path):
    _late_end(tmp_path)
    with ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("fast"))) as server:
        data, how, _last_data, ended = _timed_exchange(server.base_url)
    assert how == "complete" and dechunk(data)[1]
    assert ended < 1.0, ended
    source = load_source(tmp_path / "late-end.jsonl")
    assert plan(source, parse_faults("latency:ms=5"), Timing.parse("fast")).end.at < 0.1


def test_the_plan_ends_at_the_recorded_end_scaled_stalled_and_resumed(tmp_path):
    source = load_source(_late_end(tmp_path))
    assert source.duration_ms == LATE_END_MS
    assert plan(source, [], Timing.parse("original")).end.at == pytest.approx(1.5)
    assert plan(source, [], Timing.parse("scale=2")).end.at == pytest.approx(3.0)
    assert plan(source, parse_faults("stall:after=1,secs=2"), Timing.parse("original")).end.at == pytest.approx(3.5)
    assert plan(source, parse_faults("latency:ms=100"), Timing.parse("original")).end.at == pytest.approx(1.6)
    resumed = plan(source, [], Timing.parse("original"), start_after=2)
    assert resumed.end.at == pytest.approx(1.5 - source.frames[2].t_ms / 1000)


def test_a_cut_or_an_injected_error_ends_the_stream_without_waiting_for_the_recorded_end(tmp_path):
    source = load_source(_late_end(tmp_path))
    for faults in ("cut:event=1", "cut:event=1,style=abort", "error:kind=openai,after=1"):
        the_plan = plan(source, parse_faults(faults), Timing.parse("original"))
        assert the_plan.end.at < 0.1, (faults, the_plan.end)
    stalled = plan(source, parse_faults("cut:event=2;stall:after=1,secs=0.5"), Timing.parse("original"))
    assert stalled.end.at == pytest.approx(0.5 + stalled.writes[0].at, abs=0.01)


def test_a_swapped_tail_ends_when_the_other_recording_ended(tmp_path):
    source = load_source(_late_end(tmp_path))
    other_path = _write(tmp_path / "other.jsonl", openai_chat_frames(words=3, tool=False), gap_ms=1.0,
                        end={"stream_end": "finished", "duration_ms": 400.0})
    other = load_source(other_path)
    the_plan = plan(source, parse_faults("swap-tail:with=other.jsonl,at=1"), Timing.parse("original"),
                    others={"other.jsonl": other})
    assert the_plan.end.at == pytest.approx(0.4)  # both recordings' event 1 came at 1 ms: no shift


# --- bounds on a plan ----------------------------------------------------------------------


def _big_frames(size: int) -> list[bytes]:
    filler = b"a" * 1000
    return [b'data: {"n":%d,"s":"%s"}\n\n' % (i, filler) for i in range(size // 1000 + 1)]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A recording of a body above MAX_PLAN_WRITES bytes: fragment:max=1 would write each byte."""
    folder = tmp_path_factory.mktemp("big")
    _write(folder / "big.jsonl", _big_frames(MAX_PLAN_WRITES + 100_000), gap_ms=0.0,
           end={"stream_end": "finished", "duration_ms": 5.0})
    return folder


def test_a_fault_header_asking_for_too_many_writes_gets_a_quick_400(big):
    body = load_source(big / "big.jsonl").body
    assert len(body) > MAX_PLAN_WRITES
    options = ServeOptions(fault_header=True)
    with ServerThread(Library.load([big]), options) as server, httpx.Client(timeout=30) as client:
        for spec in ("fragment:max=1", "bandwidth:bps=8", "fragment:max=1;latency:ms=3600000"):
            start = time.monotonic()
            refused = client.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, headers={FAULT_HEADER: spec})
            took = time.monotonic() - start
            assert refused.status_code == 400, (spec, refused.status_code)
            message = refused.json()["error"]["message"]
            assert "1,000,000 writes" in message and "or more" in message, message
            assert took < 2.0, (spec, took)
        ok = client.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, headers={FAULT_HEADER: "fragment:max=64"})
    assert ok.status_code == 200 and ok.content == body


def test_the_advised_fault_fits_under_the_bound(big):
    source = load_source(big / "big.jsonl")
    for spec in ("fragment:max=1", "bandwidth:bps=8"):
        with pytest.raises(FaultSpecError) as refused:
            plan(source, parse_faults(spec))
        advised = str(refused.value).rsplit("use ", 1)[1].split(" or more")[0]
        the_plan = plan(source, parse_faults(advised))
        assert len(the_plan.writes) <= MAX_PLAN_WRITES, advised


def test_a_plan_that_would_last_more_than_a_week_is_refused(tmp_path):
    source = load_source(_write(tmp_path / "r.jsonl", _big_frames(700_000), gap_ms=0.0, end={"stream_end": "finished"}))
    start = time.monotonic()
    with pytest.raises(FaultSpecError, match=r"would last 8\.\d days, longer than the 7 days"):
        plan(source, parse_faults("bandwidth:bps=8"))  # 700 kB at one byte a second, under the write bound
    assert time.monotonic() - start < 1.0
    with pytest.raises(FaultSpecError, match="longer than the 7 days"):
        plan(source, parse_faults(";".join(["stall:after=1,secs=86400"] * 8)))
    assert plan(source, parse_faults("stall:after=1,secs=86400")).end.at == 86_400
