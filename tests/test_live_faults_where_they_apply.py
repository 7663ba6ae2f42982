"""Live faults (``streamtap_fault``) go where mitmproxy streams an answer from the upstream, and
only there. A real mitmdump, a real upstream.

- With ``streamtap_replay`` and ``streamtap_replay_unmatched=upstream``, a list that mixes a
  replay-only fault (``stall``) with a live one (``cut``) had the live one refused on every flow
  that went upstream, for the replay-only one in its list: nothing was injected.
- A response an addon made (server replay, map_local) is sent whole, never through a stream
  callable: a cut was logged as "not reached" and its Content-Length removed.
"""

from __future__ import annotations

import time

import httpx
import pytest

import provider_streams as streams
from replay_streams import openai_chat_frames, write_recording
from streamtap.recording import read_recording
from upstream import CHAT, STREAM_REQUEST, Mitmdump, Script, Upstream

BODY = streams.openai_chat([f"w{i} " for i in range(8)])
MAKER = f'''
from mitmproxy import http

def request(flow):
    if flow.request.path.startswith("/canned"):
        flow.response = http.Response.make(200, {BODY!r}, {{"content-type": "text/event-stream"}})
'''


def finished_recordings(folder, count: int, timeout: float = 10) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        paths = sorted(p for p in folder.glob("*.jsonl") if not p.name.endswith(".partial.jsonl"))
        if len(paths) >= count:
            return [read_recording(p) for p in paths]
        time.sleep(0.05)
    raise AssertionError(f"no {count} recordings in {folder}")


def test_with_replay_on_a_flow_that_goes_upstream_takes_the_lists_live_faults(tmp_path):
    recordings = tmp_path / "recs"
    recordings.mkdir()
    write_recording(recordings / "openai.jsonl", "openai", openai_chat_frames(words=3))
    options = {"streamtap_replay": str(recordings), "streamtap_replay_unmatched": "upstream",
               "streamtap_fault": "stall:after=1,secs=1;cut:event=2,style=clean"}
    with Upstream() as upstream:
        upstream.add("live", Script(BODY))
        with Mitmdump(upstream.url, tmp_path / "work", options=options) as mitm:
            got = httpx.post(f"{mitm.url}/s/live{CHAT}", content=STREAM_REQUEST, timeout=15)
            [recording] = finished_recordings(mitm.record_dir, 1)
            log = mitm.log()
    assert BODY.startswith(got.content) and got.content.endswith(b"\n\n") and len(got.content) < len(BODY) / 2
    assert recording.end["injected_fault"] == "cut:event=2,style=clean" and recording.verdict["kind"] == "truncated"
    assert "fault not applied" not in log, log[-2000:]


@pytest.mark.parametrize("fault", ["cut:event=2,style=clean", "fragment:max=7"])
def test_a_response_an_addon_made_takes_no_live_fault_and_says_so(tmp_path, fault):
    maker = tmp_path / "maker.py"
    maker.write_text(MAKER)
    with Upstream() as upstream:
        mitm = Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_fault": fault})
        mitm.args += ["-s", str(maker)]
        with mitm:
            got = httpx.post(f"{mitm.url}/canned{CHAT}", content=STREAM_REQUEST, timeout=10)
            [recording] = finished_recordings(mitm.record_dir, 1)
            log = mitm.log()
    assert got.content == BODY and got.headers["content-length"] == str(len(BODY))
    assert "an addon made this response" in log and "not reached" not in log, log[-2000:]
    assert "injected_fault" not in recording.end and recording.verdict["kind"] == "complete", recording.end
