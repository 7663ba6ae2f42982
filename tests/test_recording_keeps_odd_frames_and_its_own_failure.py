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
    def broken(event):
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
