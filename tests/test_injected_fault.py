"""An answer made by streamtap's own fault injection is never recorded as the upstream's own.

A real `mitmdump -s addon/tap.py` records (a) a real `streamtap serve` that serves a recording
with a fault (the server names it in x-streamtap-injected-fault) and (b) a live upstream with
the `streamtap_fault` option: the recording's end line, the verdict's evidence, the log line
and `streamtap verify` name the fault. Nothing is named where no fault changed the answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording
from upstream import Mitmdump, Script, Upstream

from streamtap.recording import read_recording

pytestmark = pytest.mark.slow

STREAMTAP = [str(Path(sys.executable).with_name("streamtap"))]
OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()
LIVE = b"".join(b'data: {"i": %d}\n\n' % i for i in range(30))


def _serve(recordings: Path, *args: str):
    proc = subprocess.Popen([*STREAMTAP, "serve", str(recordings), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(proc.stderr.read())
    return proc, url


def _recording(mitm: Mitmdump, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        paths = [p for p in mitm.record_dir.glob("*.jsonl") if not p.name.endswith(".partial.jsonl")] if mitm.record_dir.is_dir() else []
        if paths:
            [path] = paths
            return path, read_recording(path)
        time.sleep(0.05)
    raise AssertionError(f"no recording:\n{mitm.log()[-3000:]}")


def _verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*STREAMTAP, "verify", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("fault", [None, "cut:event=7,style=clean", "duplicate:event=3"])
def test_a_faulted_replay_recorded_through_the_tap_names_its_fault(tmp_path, fault):
    recordings = tmp_path / "replay"
    recordings.mkdir()
    write_recording(recordings / "openai.jsonl", "openai", openai_chat_frames(words=12))
    proc, url = _serve(recordings, *(["--fault", fault] if fault else []))
    try:
        with Mitmdump(url, tmp_path / "work") as mitm:
            response = httpx.post(mitm.url + "/v1/chat/completions", content=OPENAI_BODY, timeout=15)
            assert response.status_code == 200
            assert response.headers.get("x-streamtap-injected-fault") == fault
            path, rec = _recording(mitm)
            log = mitm.wait_log("streamtap: openai-chat")
    finally:
        proc.terminate()
        proc.wait(10)
    verified = _verify(path)
    if fault is None:  # the upstream's own answer: nothing named anywhere
        assert "injected_fault" not in rec.end and "injected_fault" not in rec.verdict["evidence"]
        assert "injected fault" not in log and "injected fault" not in verified.stdout
        assert "injected " not in subprocess.run([*STREAMTAP, "show", str(path)], capture_output=True, text=True, timeout=60).stdout
        assert rec.verdict["kind"] == "complete" and verified.returncode == 0
        return
    assert rec.end["injected_fault"] == fault
    assert rec.verdict["evidence"]["injected_fault"] == fault
    assert f"[injected fault: {fault}]" in log
    assert f"[injected fault: {fault}]" in verified.stdout
    if fault.startswith("cut"):
        assert rec.verdict["kind"] == "truncated" and verified.returncode == 1
    else:  # a duplicated text delta is invisible in Chat Completions: complete, but never silently
        assert rec.body == response.content
    shown = subprocess.run([*STREAMTAP, "show", str(path)], capture_output=True, text=True, timeout=60)
    assert f"injected  {fault} (streamtap's fault injection made this answer)" in shown.stdout
    verified_json = subprocess.run([*STREAMTAP, "verify", "--json", str(path)], capture_output=True, text=True, timeout=60)
    assert json.loads(verified_json.stdout)["verdict"]["evidence"]["injected_fault"] == fault


@pytest.mark.parametrize(
    "fault, named",
    [
        ("cut:event=5,style=clean", True),
        ("duplicate:event=2", True),
        ("cut:event=500", False),  # past the end: the stream passes as it came
        ("corrupt:frame=2,offset=999", False),  # no such byte: logged as not applied
    ],
)
def test_a_live_fault_names_itself_in_the_recording_only_when_it_changed_the_answer(tmp_path, fault, named):
    with Upstream() as upstream:
        upstream.add("live", Script(LIVE, gap=0.005))
        with Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_fault": fault}) as mitm:
            response = httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15)
            path, rec = _recording(mitm)
            log = mitm.wait_log("streamtap: unknown")
    assert rec.body == response.content, "the Tap records what the client got"
    verified = _verify(path)
    if named:
        assert response.content != LIVE
        assert rec.end["injected_fault"] == fault and rec.verdict["evidence"]["injected_fault"] == fault
        assert f"[injected fault: {fault}]" in log and f"[injected fault: {fault}]" in verified.stdout
    else:
        assert response.content == LIVE
        assert "injected_fault" not in rec.end and "injected fault" not in log + verified.stdout


def test_a_live_cut_inside_anthropic_tool_arguments_through_mitmdump(tmp_path):
    """Anthropic's tool arguments are known once the block stops: the proxy holds the call's events
    back until then and the client gets exactly what replay would serve; the recording says why."""
    from replay_streams import ANTHROPIC_REQUEST, anthropic_frames

    from streamtap.replay.faults import parse_faults, plan
    from streamtap.replay.source import Source

    frames = anthropic_frames()
    fault = "cut:at=tool-args,style=clean"
    expected = plan(Source.from_frames(frames, dialect="anthropic"), parse_faults(fault)).body
    with Upstream() as upstream:
        upstream.add("anth", Script(b"".join(frames), gap=0.005))
        with Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_fault": fault}) as mitm:
            response = httpx.post(mitm.url + "/s/anth/v1/messages", json=ANTHROPIC_REQUEST, timeout=15)
            path, rec = _recording(mitm)
            log = mitm.wait_log("streamtap: anthropic")
    assert response.content == expected == rec.body
    assert rec.verdict["kind"] == "truncated" and rec.end["injected_fault"] == fault
    assert f"{fault}: clean cut at byte {len(expected)} (inside the tool-call arguments of event" in log
