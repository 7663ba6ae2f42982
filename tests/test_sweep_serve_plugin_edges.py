"""Edges of `serve`, `sweep` and the pytest plugin: a cut at the very end cuts nothing, a
client that fails even uncut proves nothing, a 400 answer is logged as any other, several
recordings of one request answer by name whatever the argument order, and an empty
`streamtap_faults` marker fails its own test, not the collection. Real processes, servers and
sockets, as the tests of these modules use."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import httpx
import pytest
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording

from streamtap.replay.faults import FaultSpecError, parse_faults
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import ServeOptions, ServerThread
from streamtap.replay.source import load_source
from streamtap.replay.sweep import INCONCLUSIVE, NOTICED, SILENT, WHOLE, classify, run_sweep, sweep_positions

pytest_plugins = ["pytester"]

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]
OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()

# stdlib only (starts fast): prints whatever answer it got and exits 0, cut or not
CARELESS = """
import http.client, json, os, urllib.parse
url = urllib.parse.urlsplit(os.environ["STREAMTAP_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
conn.request("POST", "/v1/chat/completions", body=b"{}", headers={"content-type": "application/json"})
text = []
try:
    for line in conn.getresponse():
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice["delta"].get("content") or "")
except Exception:
    pass
print("".join(text))
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return write_recording(tmp_path_factory.mktemp("review") / "twenty.jsonl", "openai", openai_chat_frames(words=12))


@pytest.fixture
def careless(tmp_path):
    path = tmp_path / "careless.py"
    path.write_text(CARELESS)
    return [sys.executable, "-S", str(path)]


def streamtap_sweep(*args):
    return subprocess.run([*STREAMTAP, "sweep", *map(str, args)], capture_output=True, text=True, timeout=120)


# --- 1. a cut at the very end cuts nothing -----------------------------------------------


def test_a_position_at_the_very_end_is_refused_before_any_run(recording, tmp_path):
    source = load_source(recording)
    length = len(source.body)
    last = sum(1 for frame in source.frames if frame.seq is not None) - 1
    for item, message in [
        (f"byte={length}", f"'cut:byte={length}': byte {length} is the end of the body: nothing would be cut"),
        (f"event={last}", f"'cut:event={last}': event {last} is the last event: nothing would be cut"),
    ]:
        with pytest.raises(FaultSpecError, match=message):
            sweep_positions(source, item)
    assert sweep_positions(source, f"byte={length - 1},event={last - 1}") == [f"cut:byte={length - 1}", f"cut:event={last - 1}"]
    ran = tmp_path / "ran"
    marker = tmp_path / "marker.py"
    marker.write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = streamtap_sweep(recording, "--positions", f"events,byte={length}", "--", sys.executable, "-S", marker)
    [line] = result.stderr.splitlines()
    assert result.returncode == 2 and "nothing would be cut" in line and "Traceback" not in result.stderr, result.stderr
    assert not ran.exists(), "a client ran"


def test_a_cut_run_that_still_got_a_complete_stream_is_never_silent(recording, careless):
    answer = "The weather in Paris today is mild"
    assert classify(0, answer, timed_out=False, answer=answer, complete=True) == WHOLE
    assert classify(0, answer, timed_out=False, answer=answer) == SILENT
    assert classify(1, answer, timed_out=False, answer=answer, complete=True) == NOTICED
    # past sweep_positions' check (a library caller): the client gets the whole stream
    source = load_source(recording)
    report = asyncio.run(run_sweep(source, careless, positions=[f"cut:byte={len(source.body)}"], styles=("clean",), timeout=15))
    [run] = report.runs
    assert (run.verdict, run.outcome) == ("complete", WHOLE), run
    assert report.baseline.outcome == SILENT  # uncut, taking the whole answer is what it shows


# --- 2. a client that fails even uncut ---------------------------------------------------


def test_a_client_that_fails_without_any_cut_makes_the_sweep_inconclusive_not_a_pass(recording):
    broken = [sys.executable, "-S", "-c", "import streamtap_review_module_not_installed"]
    result = streamtap_sweep(recording, "--positions", "event=2,event=5", "--", *broken)
    assert result.returncode == 1, (result.stdout, result.stderr)
    summary = result.stdout.splitlines()
    assert summary[-2].endswith("0 silently accepted partial output, 0 noticed, 0 hung, 0 crashed, 4 inconclusive"), result.stdout
    assert summary[-1].startswith("inconclusive: without any cut the client was noticed (exit 1)"), result.stdout
    report = json.loads(streamtap_sweep(recording, "--json", "-", "--positions", "event=2", "--", *broken).stdout)
    assert report["baseline_failed"] is True and {r["outcome"] for r in report["runs"]} == {INCONCLUSIVE}


# --- 3. a 400 is logged and recorded as a 404 is ------------------------------------------


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


# --- 4. of several recordings of one request, the first by name answers ---------------------


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


# --- 5. an empty streamtap_faults marker fails its test alone -------------------------------

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
