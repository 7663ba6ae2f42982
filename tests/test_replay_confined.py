"""A fault arriving in a request header names only recordings the server was given, and its
errors tell nothing about other paths: the replay server (`streamtap serve`, ServerThread)
and the replay inside a real mitmdump."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording
from upstream import Mitmdump, Script, Upstream

from streamtap.replay.faults import Timing
from streamtap.replay.match import Library
from streamtap.replay.server import ServeOptions, ServerThread

OTHER_WORDS = 30  # the outside recording differs from the served one after the swap point


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("confined")
    served = root / "served"
    served.mkdir()
    write_recording(served / "openai.jsonl", "openai", openai_chat_frames(words=20))
    write_recording(served / "sibling.jsonl", "openai", openai_chat_frames(words=25), request=OPENAI_REQUEST | {"model": "sibling"})
    outside = root / "elsewhere" / "outside.jsonl"
    outside.parent.mkdir()
    write_recording(outside, "openai", openai_chat_frames(words=OTHER_WORDS), request=OPENAI_REQUEST | {"model": "outside"})
    return served, outside


def probes(served, outside) -> dict[str, str]:
    """Names a hostile client may try, none of them a served recording."""
    return {
        "outside recording (absolute)": str(outside),
        "outside recording (relative to the served folder)": f"../elsewhere/{outside.name}",
        "an existing non-recording": "/etc/passwd",
        "an existing protected file": "/etc/shadow",
        "a directory": "/etc",
        "a missing file": "/nonexistent/nothing.jsonl",
    }


def _message_shape(message: str, name: str) -> str:
    return message.replace(name, "NAME")


def _check_refusals(post, served, outside):
    shapes = set()
    for what, name in probes(served, outside).items():
        response = post(f"swap-tail:with={name},at=3")
        assert response.status_code == 400, (what, response.status_code, response.content[:300])
        error = response.json()["error"]
        assert error["type"] == "streamtap_bad_fault"
        shapes.add(_message_shape(error["message"], name))
        assert b"outside" not in response.content.replace(name.encode(), b"") or "outside" in what
    assert len(shapes) == 1, f"the answers tell the paths apart: {shapes}"
    [shape] = shapes
    for leak in ("permission", "denied", "not a recording", "directory", "no such", "errno", "line 1"):
        assert leak not in shape.lower(), shape


def test_the_server_refuses_every_path_it_was_not_given_alike(places):
    served, outside = places
    with ServerThread(Library.load([served]), ServeOptions(Timing.parse("fast"), fault_header=True)) as server:

        def post(spec):
            return httpx.post(server.base_url + "/v1/chat/completions", json=OPENAI_REQUEST, headers={"x-streamtap-fault": spec}, timeout=10)

        _check_refusals(post, served, outside)
        # a served recording may be named, by file name or by path
        frames = openai_chat_frames(words=20)
        sibling = openai_chat_frames(words=25)
        for name in ("sibling.jsonl", str(served / "sibling.jsonl")):
            response = post(f"swap-tail:with={name},at=3")
            assert response.status_code == 200, response.text
            assert response.content == b"".join(frames[:4] + sibling[4:])


def test_operator_faults_may_still_name_a_recording_anywhere(places):
    """The operator's own --fault (not a request header) names files as before."""
    served, outside = places
    from streamtap.replay.faults import parse_faults

    options = ServeOptions(Timing.parse("fast"), parse_faults(f"swap-tail:with={outside},at=3"), fault_header=True)
    with ServerThread(Library.load([served]), options) as server:
        response = httpx.post(server.base_url + "/v1/chat/completions", json=OPENAI_REQUEST, timeout=10)
        assert response.status_code == 200
        assert response.content == b"".join(openai_chat_frames(words=20)[:4] + openai_chat_frames(words=OTHER_WORDS)[4:])
        # and a request header may name what the operator loaded, by the operator's name
        again = httpx.post(server.base_url + "/v1/chat/completions", json=OPENAI_REQUEST,
                           headers={"x-streamtap-fault": f"swap-tail:with={outside},at=5"}, timeout=10)
        assert again.status_code == 200


@pytest.mark.slow
def test_the_fault_header_inside_mitmproxy_is_confined_too(places, tmp_path):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    served, outside = places
    live = b"".join(b'data: {"i": %d}\n\n' % i for i in range(10))
    with Upstream() as upstream:
        upstream.add("live", Script(live))
        options = {"streamtap_replay": str(served), "streamtap_fault_header": "true", "streamtap_replay_unmatched": "upstream"}
        with Mitmdump(upstream.url, tmp_path / "m", options=options) as proxy:

            class Answer:
                def __init__(self, result):
                    head, _, body = result.stdout.partition(b"\r\n\r\n")
                    self.status_code = int(head.split(b" ", 2)[1])
                    self.content = body

                def json(self):
                    return json.loads(self.content)

            def post(spec):
                result = subprocess.run(
                    ["curl", "-sS", "-i", "--max-time", "10", "-H", "content-type: application/json", "-H", f"x-streamtap-fault: {spec}",
                     "--data-binary", json.dumps(OPENAI_REQUEST), proxy.url + "/v1/chat/completions"],
                    capture_output=True, timeout=20,
                )
                assert result.returncode == 0, result.stderr
                return Answer(result)

            _check_refusals(post, served, outside)
            ok = post("swap-tail:with=sibling.jsonl,at=3")
            assert ok.status_code == 200
            assert ok.content == b"".join(openai_chat_frames(words=20)[:4] + openai_chat_frames(words=25)[4:])
            # a live (not replayed) flow never takes swap-tail: it passes untouched, whatever it names
            result = subprocess.run(["curl", "-sS", "--max-time", "10", "-H", "x-streamtap-fault: swap-tail:with=/etc/shadow",
                                     "-d", "{}", proxy.url + "/s/live/x"], capture_output=True, timeout=20)
            assert result.returncode == 0 and result.stdout == live, result.stderr
            assert upstream.last("live").headers.get("x-streamtap-fault") is None
            log = proxy.wait_log("works on replays only")
    assert "Traceback" not in log
    for leak in ("Permission denied", "not a recording", "root:"):
        assert leak not in log
