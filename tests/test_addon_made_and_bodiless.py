"""Responses that do not stream through the Tap's callable: one an addon made (mitmproxy sends
its body whole and calls no stream callable) is judged on that body, and answers that cannot
have a body (HEAD, 204, 304) are not taken for turns. A real mitmdump, a real upstream."""

from __future__ import annotations

import time

import httpx
import pytest

import provider_streams as streams
from streamtap.recording import check_recording, read_recording
from upstream import CHAT, STREAM_REQUEST, Mitmdump, Script, Upstream

CANNED = streams.openai_chat(["made ", "by ", "an ", "addon"])
MAKER = f'''
from mitmproxy import http

CANNED = {CANNED!r}

def request(flow):
    if flow.request.path.startswith("/canned"):
        flow.response = http.Response.make(200, CANNED, {{"content-type": "text/event-stream"}})
'''


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("made")
    maker = workdir / "maker.py"
    maker.write_text(MAKER)
    with Upstream() as upstream:
        mitm = Mitmdump(upstream.url, workdir)
        mitm.args += ["-s", str(maker)]  # after the Tap, as a user's own script would be
        with mitm:
            mitm.upstream = upstream
            yield mitm


def recordings(proxy) -> list:
    return sorted(p for p in proxy.record_dir.glob("*.jsonl") if not p.name.endswith(".partial.jsonl"))


def test_a_response_an_addon_made_is_judged_on_its_body(proxy):
    got = httpx.post(f"{proxy.url}/canned{CHAT}", content=STREAM_REQUEST, timeout=10)
    assert got.content == CANNED
    deadline = time.monotonic() + 10
    while not (found := [p for p in recordings(proxy) if b"/canned/" in p.read_bytes().split(b"\n", 1)[0]]):
        assert time.monotonic() < deadline, proxy.log()
        time.sleep(0.05)
    rec = read_recording(found[0])
    assert rec.body == CANNED and check_recording(rec) == []
    assert rec.verdict["kind"] == "complete", rec.verdict


@pytest.mark.parametrize("name, method, status", [("head", "HEAD", 200), ("nocontent", "POST", 204), ("notmodified", "POST", 304)])
def test_an_answer_that_cannot_have_a_body_is_not_a_turn(proxy, name, method, status):
    body = streams.openai_chat(["x"]) if method == "HEAD" else b""
    proxy.upstream.add(name, Script(body, status=status, framing="length"))
    before = set(proxy.record_dir.glob("*")) if proxy.record_dir.exists() else set()
    got = httpx.request(method, f"{proxy.url}/s/{name}{CHAT}", content=STREAM_REQUEST if method == "POST" else None, timeout=10)
    assert got.status_code == status and got.content == b""
    # a turn after it is recorded: by then the bodiless one would have been too
    proxy.upstream.add(f"{name}-after", Script(streams.openai_chat(["y"])))
    httpx.post(f"{proxy.url}/s/{name}-after{CHAT}", content=STREAM_REQUEST, timeout=10)
    deadline = time.monotonic() + 10
    while True:
        new = [p for p in set(proxy.record_dir.glob("*.jsonl")) - before if not p.name.endswith(".partial.jsonl")]
        if new:
            break
        assert time.monotonic() < deadline, proxy.log()
        time.sleep(0.05)
    time.sleep(0.2)
    heads = [read_recording(p).header["request"]["url"] for p in set(proxy.record_dir.glob("*.jsonl")) - before]
    assert all(f"/s/{name}-after/" in url for url in heads), heads
