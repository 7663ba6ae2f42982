"""Edges of `serve` and the pytest plugin: a 400 answer is logged as any other, several
recordings of one request answer by name whatever the argument order, and an empty
`streamtap_faults` marker fails its own test, not the collection. Real servers, sockets and
pytest runs, as the tests of these modules use."""

from __future__ import annotations

import json
import shutil

import httpx
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording

from streamtap.replay.faults import parse_faults
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import ServeOptions, ServerThread

pytest_plugins = ["pytester"]

OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()


# --- a 400 is logged and recorded as a 404 is ---------------------------------------------


def test_a_400_answer_is_logged_and_recorded(tmp_path):
    no_tool = write_recording(tmp_path / "no-tool.jsonl", "openai", openai_chat_frames(words=3, tool=False))
    # the start-up fault fits this one only, so the server starts; a request for the other gets the 400
    tool = write_recording(tmp_path / "tool.jsonl", "openai", openai_chat_frames(words=3), request=OPENAI_REQUEST | {"model": "other"})
    lines: list[str] = []
    options = ServeOptions(faults=parse_faults("cut:at=tool-args,style=abort"), fault_header=True)
    with ServerThread(Library.load([no_tool, tool]), options, log=lines.append) as server, httpx.Client(timeout=5) as client:
        misfit = client.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY)
        bad_header = client.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, headers={"x-streamtap-fault": "cut:evnt=3"})
        served = list(server.served)
    assert misfit.status_code == bad_header.status_code == 400
    assert [(s.status, s.recording) for s in served] == [(400, str(no_tool))] * 2
    assert "has no tool-args position" in served[0].refused and "cut takes" in served[1].refused
    assert lines[0].startswith(f"streamtap replay: POST /v1/chat/completions -> 400 ({no_tool}: ") and "tool-args" in lines[0], lines
    assert lines[1].startswith(f"streamtap replay: POST /v1/chat/completions -> 400 ({no_tool}: ") and "cut takes" in lines[1], lines


# --- of several recordings of one request, the first by name answers ------------------------


def answered_by(paths) -> list[str]:
    """Which recording answers each of two identical requests, --once."""
    with ServerThread(Library.load(paths, MatchOptions(once=True)), ServeOptions()) as server, httpx.Client(timeout=5) as client:
        for _ in range(2):
            assert client.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY).status_code == 200
        return [served.recording for served in server.served]


def test_the_first_recording_by_name_answers_whatever_the_argument_order(tmp_path):
    a = write_recording(tmp_path / "a.jsonl", "openai", openai_chat_frames(words=3))
    b = tmp_path / "b.jsonl"
    shutil.copy(a, b)
    assert answered_by([b, a]) == [str(a), str(b)]
    later, earlier = tmp_path / "later", tmp_path / "earlier"
    for folder in (later, earlier):
        folder.mkdir()
        shutil.copy(a, folder / "answer.jsonl")
    assert answered_by([later, earlier]) == [str(earlier / "answer.jsonl"), str(later / "answer.jsonl")]


# --- an empty streamtap_faults marker fails its test alone ----------------------------------

EMPTY_MARKER = """
import pytest


def test_unrelated():
    pass


@pytest.mark.streamtap_faults()
def test_empty_marker(streamtap_replay):
    pass
"""


def test_an_empty_faults_marker_fails_only_its_test_in_one_line(pytester):
    pytester.makepyfile(test_empty=EMPTY_MARKER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*ERROR at setup of test_empty_marker*", "@pytest.mark.streamtap_faults needs at least one fault spec (or None)"])
    assert "pluggy" not in out and "Traceback" not in out and "Interrupted" not in out, out
