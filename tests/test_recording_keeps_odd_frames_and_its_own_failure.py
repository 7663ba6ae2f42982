"""A frame the SSE rules take but orjson cannot write (a ``retry`` past 64 bits) is recorded; and
when recording a flow fails for a bug rather than the disk, the recording says so before it stops."""

from __future__ import annotations

import json
import subprocess
import sys

import orjson
from mitmproxy.test import tflow

from streamtap.mitm.flowtap import FlowTap
from streamtap.providers import StreamEnd
from streamtap.recording import writer as writer_module

RETRY = 99999999999999999999999  # digits only: a valid retry for the SSE rules, past 64 bits

CHUNK = {"id": "chatcmpl-R1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-test-1",
         "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
BODY = f"retry: {RETRY}\ndata: {json.dumps(CHUNK)}\n\ndata: [DONE]\n\n".encode()


def chat_tap(tmp_path) -> FlowTap:
    flow = tflow.tflow(resp=True)
    flow.request.method, flow.request.path = "POST", "/v1/chat/completions"
    flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = None
    return FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1 << 20, record=True)


def tapped(tmp_path, body: bytes) -> dict:
    tap = chat_tap(tmp_path)
    for i in range(0, len(body), 50):
        tap.arrived(body[i : i + 50], None)
    return tap.finish(StreamEnd.FINISHED)


def test_a_retry_past_64_bits_is_recorded_and_verifies(tmp_path):
    summary = tapped(tmp_path, BODY)
    assert not summary["errors"], summary["errors"]
    assert summary["verdict"] == "complete", summary
    lines = open(summary["recording"], "rb").read().splitlines()
    first_frame = json.loads(lines[1])  # the json module: orjson would read the retry as a double
    assert first_frame["type"] == "frame" and first_frame["event"]["retry"] == RETRY
    assert orjson.loads(lines[-1])["type"] == "end"
    result = subprocess.run([sys.executable, "-m", "streamtap", "verify", summary["recording"]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and ": complete " in result.stdout, result.stdout + result.stderr


def test_a_bug_while_recording_leaves_a_note_in_the_recording(tmp_path, monkeypatch):
    def broken(event, previous_id=""):
        raise TypeError("a bug in describing a frame")

    monkeypatch.setattr(writer_module, "describe", broken)
    monkeypatch.setattr(writer_module, "_PLAIN_SSE", {})  # the cached descriptions would skip the bug
    summary = tapped(tmp_path, BODY)
    assert any("a bug in describing a frame" in error for error in summary["errors"]), summary
    assert summary["recording"] is None  # not finished: the reader is told why by the note
    [partial] = tmp_path.glob("*.partial.jsonl")
    lines = [orjson.loads(line) for line in partial.read_bytes().splitlines()]
    assert lines[0]["type"] == "header"
    notes = [line for line in lines if line["type"] == "note"]
    assert notes and notes[0]["kind"] == "streamtap_error" and "a bug in describing a frame" in notes[0]["message"]


def test_a_flow_whose_analysis_stopped_counts_the_events_it_recorded(tmp_path):
    """Analysis that fell behind at byte N: the summary (the log line, the events metric) counts
    the frames analysed and recorded before, not 0."""
    tap = chat_tap(tmp_path)
    event = f"data: {json.dumps(CHUNK)}\n\n".encode()
    tap.arrived(event * 7, None)
    tap.lost_from(len(event) * 7, "analysis fell behind")
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "unknown" and any("fell behind" in e for e in summary["errors"]), summary
    frames = [line for line in open(summary["recording"], "rb") if orjson.loads(line)["type"] == "frame"]
    assert summary["events"] == len(frames) == 7


def _stopped_end(summary: dict) -> dict:
    """The end line of a flow whose analysis stopped, checked to have every field an end line has
    (readers such as DuckDB take one shape) and the count the file holds."""
    from streamtap.recording import check_recording, read_recording

    rec = read_recording(summary["recording"])
    end = rec.end
    assert end["turn"] is None and end["ttft_ms"] is None, end
    assert end["verdict"]["seq"] is None and end["verdict"]["offset"] is None and end["verdict"]["kind"] == "unknown"
    assert end["events"] == len(rec.frames) + (rec.tail is not None) == summary["events"]
    assert check_recording(rec) == []
    [note] = [n for n in rec.notes if n["kind"] == "streamtap_error"]
    assert isinstance(note["t"], float) and note["t"] >= 0  # the live Tap knows when (only imports say null)
    return end


def test_the_end_line_of_a_flow_that_fell_behind_has_every_field(tmp_path):
    tap = chat_tap(tmp_path)
    event = f"data: {json.dumps(CHUNK)}\n\n".encode()
    tap.arrived(event * 7, None)
    tap.lost_from(len(event) * 7, "analysis fell behind")
    assert _stopped_end(tap.finish(StreamEnd.FINISHED))["events"] == 7


def test_the_end_line_of_a_flow_whose_analysis_failed_has_every_field(tmp_path, monkeypatch):
    from streamtap.providers import StreamSession

    tap = chat_tap(tmp_path)
    event = f"data: {json.dumps(CHUNK)}\n\n".encode()
    tap.arrived(event * 3, None)
    monkeypatch.setattr(StreamSession, "feed", lambda self, chunk, t=None: 1 / 0)  # a bug in the analysis
    tap.arrived(event * 2, None)
    summary = tap.finish(StreamEnd.FINISHED)
    assert any("ZeroDivisionError" in error for error in summary["errors"]), summary
    assert _stopped_end(summary)["events"] == 3


def test_a_cut_tail_whose_close_failed_is_not_counted(tmp_path, monkeypatch):
    """The session counts the cut tail as its close begins; a close that then fails hands it back
    to no one, and the recording keeps its bytes as raw: the end line counts what it holds."""
    from streamtap.providers import StreamSession

    tap = chat_tap(tmp_path)
    event = f"data: {json.dumps(CHUNK)}\n\n".encode()
    tap.arrived(event * 3 + event[:20], None)  # cut inside the fourth event
    monkeypatch.setattr(StreamSession, "_judge", lambda self, *args, **kwargs: 1 / 0)  # a bug in the judging
    end = _stopped_end(tap.finish(StreamEnd.UPSTREAM_RESET))
    assert end["events"] == 3


def test_a_failure_after_the_close_recorded_the_tail_keeps_its_bytes_once(tmp_path, monkeypatch):
    from streamtap.providers.turn import Turn

    tap = chat_tap(tmp_path)
    event = f"data: {json.dumps(CHUNK)}\n\n".encode()
    tap.arrived(event * 3 + event[:20], None)
    monkeypatch.setattr(Turn, "to_dict", lambda self: 1 / 0)  # a bug once the close is done
    end = _stopped_end(tap.finish(StreamEnd.UPSTREAM_RESET))  # (no body byte recorded twice)
    assert end["events"] == 4 and end["bytes"] == len(event) * 3 + 20
