"""Replay and live faults inside a real `mitmdump -s addon/tap.py`.

Replayed answers stream with their timing through the Tap (so they are recorded again,
byte-identical); unmatched requests go upstream or get the JSON 404; faults reach the
client as the spec says (curl exit codes); live streams from a fake provider get the
same faults, and the Tap records exactly what the client got.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from replay_streams import (
    ANTHROPIC_REQUEST,
    BEDROCK_MODEL,
    BEDROCK_REQUEST,
    OPENAI_REQUEST,
    anthropic_frames,
    bedrock_invoke_frames,
    openai_chat_frames,
    openai_text,
    write_recording,
)
from upstream import Mitmdump, Script, Upstream

from streamtap.recording import read_recording

pytestmark = pytest.mark.slow

OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()
LIVE = b"".join(b'data: {"i": %d, "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}\n\n' % i for i in range(40))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    work = tmp_path_factory.mktemp("replay-mitm")
    recordings = work / "replay"
    recordings.mkdir()
    write_recording(recordings / "openai.jsonl", "openai", openai_chat_frames(words=20), gap_ms=20)
    write_recording(recordings / "anthropic.jsonl", "anthropic", anthropic_frames())
    write_recording(recordings / "bedrock.jsonl", "bedrock", bedrock_invoke_frames(), gap_ms=5)
    with Upstream() as upstream:
        upstream.add("live", Script(LIVE, gap=0.01))
        options = {
            "streamtap_replay": str(recordings),
            "streamtap_replay_unmatched": "upstream",
            "streamtap_fault_header": "true",
        }
        with Mitmdump(upstream.url, work, options=options) as mitm:
            mitm.upstream = upstream
            mitm.replay_dir = recordings
            yield mitm


def new_recordings(proxy, before: set[Path], count: int = 1, timeout: float = 10, provider: str = "") -> list:
    """The recordings finished since ``before``; ``provider``: only its (named in the file name), so
    that a recording of the test before, finished late on a loaded machine, is not taken for this one's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        paths = sorted(p for p in proxy.record_dir.glob(f"*_{provider}*.jsonl" if provider else "*.jsonl")
                       if p not in before and not p.name.endswith(".partial.jsonl"))
        if len(paths) >= count:
            return [read_recording(p) for p in paths]
        time.sleep(0.05)
    raise AssertionError(f"no new recording in {proxy.record_dir}:\n{proxy.log()[-3000:]}")


def existing(proxy, timeout: float = 10) -> set[Path]:
    """The finished recordings, once the earlier flows' are all finished: an analysis worker
    writes a recording's end a moment after the client got the last byte."""
    deadline = time.monotonic() + timeout
    while proxy.record_dir.is_dir() and any(proxy.record_dir.glob("*.partial.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.02)
    return set(proxy.record_dir.glob("*.jsonl")) if proxy.record_dir.is_dir() else set()


def curl(url: str, *args: str) -> subprocess.CompletedProcess:
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    return subprocess.run(["curl", "-sS", "-N", "--max-time", "15", *args, url], capture_output=True, timeout=30)


def test_replay_through_the_tap_streams_with_timing_and_records_the_same_body(proxy):
    import openai

    before = existing(proxy)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    arrivals, text = [], []
    start = time.monotonic()
    for chunk in client.chat.completions.create(**OPENAI_REQUEST):
        arrivals.append(time.monotonic() - start)
        text += [c.delta.content or "" for c in chunk.choices]
    original = read_recording(proxy.replay_dir / "openai.jsonl")
    # streamed with the recorded 20 ms gaps, not as one buffered body
    assert arrivals[-1] - arrivals[0] >= 0.015 * (len(arrivals) - 1)
    assert "".join(text) == openai_text(openai_chat_frames(words=20))
    [again] = new_recordings(proxy, before, provider="openai-chat")
    assert again.body == original.body
    assert again.end["verdict"]["kind"] == "complete"
    assert again.header["request"]["url"].endswith("/v1/chat/completions")


def test_bedrock_replay_through_the_tap_is_recorded_byte_identical(proxy):
    import boto3
    from botocore.config import Config

    before = existing(proxy)
    client = boto3.client(
        "bedrock-runtime", endpoint_url=proxy.url, region_name="us-east-1", aws_access_key_id="AKIDTEST",
        aws_secret_access_key="secret", config=Config(retries={"max_attempts": 0}),
    )  # fmt: skip
    response = client.invoke_model_with_response_stream(modelId=BEDROCK_MODEL, body=json.dumps(BEDROCK_REQUEST))
    events = [json.loads(e["chunk"]["bytes"]) for e in response["body"]]  # botocore checks every CRC
    assert events[-1]["type"] == "message_stop"
    [again] = new_recordings(proxy, before, provider="bedrock-invoke")
    assert again.body == read_recording(proxy.replay_dir / "bedrock.jsonl").body == b"".join(bedrock_invoke_frames())
    assert again.end["verdict"]["kind"] == "complete"


def test_unmatched_requests_go_upstream(proxy):
    r = httpx.post(proxy.url + "/s/live/v1/chat/completions", content=b"{}", timeout=10)
    assert r.status_code == 200 and r.content == LIVE


# mitmproxy passes an upstream reset on to an HTTP/1.1 client as an unterminated chunked body
@pytest.mark.parametrize("style, code", [("clean", 0), ("abort", 18), ("reset", 18)])
def test_replayed_cut_reaches_the_client_as_specified(proxy, style, code):
    before = existing(proxy)
    result = curl(proxy.url + "/v1/chat/completions", "-H", f"x-streamtap-fault: cut:event=7,style={style}", "--data-binary", OPENAI_BODY)
    assert result.returncode == code, result.stderr
    assert result.stdout == b"".join(openai_chat_frames(words=20)[:8])
    [rec] = new_recordings(proxy, before)
    assert rec.end["verdict"]["kind"] == "truncated"
    assert rec.end["stream_end"] == ("finished" if style == "clean" else "upstream_reset")


@pytest.mark.parametrize("style, code", [("clean", 0), ("abort", 18), ("reset", 56)])
def test_live_cut_reaches_the_client_as_specified(proxy, style, code):
    before = existing(proxy)
    start = time.monotonic()
    result = curl(proxy.url + "/s/live/x", "-H", f"x-streamtap-fault: cut:event=5,style={style}", "-d", "{}")
    elapsed = time.monotonic() - start
    assert result.returncode == code, result.stderr
    assert elapsed < 0.3 + 40 * 0.01, "the cut did not end the response at once"
    if style != "reset":
        assert result.stdout == LIVE[: LIVE.index(b"data", 1) * 6]
    [rec] = new_recordings(proxy, before)
    if style != "reset":
        assert rec.body == result.stdout, "the Tap must record what the client got"
    cut = len(LIVE[: LIVE.index(b"data", 1) * 6])  # (live logs the cut in replay's words)
    assert f"cut:event=5,style={style}: {style} cut at byte {cut} (after event 5)" in proxy.log()
    assert proxy.upstream.last("live").headers.get("x-streamtap-fault") is None, "the fault header leaked upstream"


def test_live_error_injection_makes_the_anthropic_sdk_raise(proxy):
    import anthropic

    proxy.upstream.add("anth", Script(b"".join(anthropic_frames()), gap=0.002))
    client = anthropic.Anthropic(
        base_url=proxy.url + "/s/anth",
        api_key="sk-ant-test",
        max_retries=0,
        default_headers={"x-streamtap-fault": "error:kind=overloaded_error,after=9"},
    )
    request = {k: v for k, v in ANTHROPIC_REQUEST.items() if k != "stream"}
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        with client.messages.stream(**request) as stream:
            stream.get_final_message()


def test_unmatched_gets_the_json_404_and_the_fault_option_cuts_replays(tmp_path):
    write_recording(tmp_path / "openai.jsonl", "openai", openai_chat_frames(words=3))
    options = {
        "streamtap_replay": str(tmp_path),
        "streamtap_replay_unmatched": "404",
        "streamtap_replay_timing": "fast",
        "streamtap_fault": "cut:event=1,style=abort",
        "streamtap_redact": "my_org_pin",  # the Tap records the 404: the Tap's own names stay out of it
    }
    with Mitmdump("http://192.0.2.1:9", tmp_path / "work", options=options) as mitm:  # no upstream at all
        r = httpx.post(mitm.url + "/v1/chat/completions", json=OPENAI_REQUEST | {"model": "other"}, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["nearest"][0]["differs_in"] == ["body.model"]
        r = httpx.post(mitm.url + "/v1/chat/completions?my_org_pin=qPin83", json=OPENAI_REQUEST | {"model": "other"}, timeout=10)
        assert r.status_code == 404 and "qPin83" not in r.text and "my_org_pin=" in r.text, r.text
        got = b""
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", mitm.url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10) as response:
                for piece in response.iter_bytes():
                    got += piece
        assert got == b"".join(openai_chat_frames(words=3)[:2])


def test_bad_replay_options_stop_mitmdump_with_a_clear_message(tmp_path):
    for option, value, message in [
        ("streamtap_fault", "cut:nowhere=1", "streamtap_fault: 'cut:nowhere=1': cut takes"),
        ("streamtap_replay", str(tmp_path / "missing"), "streamtap_replay: " + str(tmp_path / "missing") + ": no such file"),
        ("streamtap_replay_timing", "slow", "streamtap_replay_timing: timing is fast, original or scale=N"),
    ]:
        bad = Mitmdump("http://192.0.2.1:9", tmp_path / option, options={option: value})
        result = subprocess.run(bad.args, capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert result.returncode != 0 and message in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.mark.parametrize("spec", ["corrupt:frame=2,field=crc", "corrupt:frame=2,offset=999", "error:kind=modelStreamErrorException,after=2"])
def test_a_live_fault_that_does_not_fit_the_stream_is_not_applied_and_the_stream_passes(proxy, spec):
    """Fail open: a fault that does not fit this wire (an SSE body has no CRC, no payload byte 999,
    no event-stream exception) is logged as not applied; the client gets the body unchanged."""
    before = existing(proxy)
    result = curl(proxy.url + "/s/live/x", "-H", f"x-streamtap-fault: {spec}", "-d", "{}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == LIVE
    [rec] = new_recordings(proxy, before)
    assert rec.body == LIVE
    assert f"fault not applied: '{spec}'" in proxy.log()


def test_with_once_a_resume_is_answered_from_the_recording_not_sent_upstream(tmp_path):
    """Unmatched requests go upstream; a Last-Event-ID resume of an answer already served (every
    recording used up under once) still matches it, and gets its tail from the recording."""
    recordings = tmp_path / "replay"
    recordings.mkdir()
    frames = openai_chat_frames(words=20)
    write_recording(recordings / "openai.jsonl", "openai", frames)
    with Upstream() as upstream:
        options = {"streamtap_replay": str(recordings), "streamtap_replay_unmatched": "upstream",
                   "streamtap_replay_once": "true", "streamtap_replay_assign_ids": "true", "streamtap_replay_timing": "fast"}
        with Mitmdump(upstream.url, tmp_path, options=options) as mitm:
            url = mitm.url + "/v1/chat/completions"
            first = httpx.post(url, content=OPENAI_BODY, timeout=10)
            resumed = httpx.post(url, content=OPENAI_BODY, headers={"Last-Event-ID": "4"}, timeout=10)
            used_up = httpx.post(url, content=OPENAI_BODY, timeout=10)
    assert first.status_code == 200 and first.content == b"".join(b"id: %d\n" % i + raw for i, raw in enumerate(frames))
    assert resumed.status_code == 200 and resumed.content == b"".join(b"id: %d\n" % i + raw for i, raw in enumerate(frames))[
        len(b"".join(b"id: %d\n" % i + raw for i, raw in enumerate(frames[:5]))):]
    # a new request once the recording is used up goes upstream (which knows no such path)
    assert used_up.status_code == 404 and b"no script for this path" in used_up.content, used_up.content
    assert [served.path for served in upstream.served[""]] == ["/v1/chat/completions"]  # that one request only
