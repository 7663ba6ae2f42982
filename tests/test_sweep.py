"""`streamtap sweep`: a careless client shows up as silently accepting cuts, a careful one
as noticing every cut. The clients are small stdlib Python programs (fast to start), run
as real processes against real replay servers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from replay_streams import openai_chat_frames, write_recording

from streamtap.replay.faults import FaultSpecError, protocol_positions
from streamtap.replay.source import Source, load_source
from streamtap.replay.sweep import CRASHED, HUNG, INCONCLUSIVE, NOTICED, SILENT, classify, sweep_positions

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]

CLIENT = """
import http.client, json, os, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ["STREAMTAP_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
conn.request("POST", "/v1/chat/completions", body=b"{}", headers={"content-type": "application/json"})
response = conn.getresponse()
text, finish, done = [], None, False
try:
    for line in response:
        line = line.decode().rstrip("\\r\\n")
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
                finish = choice.get("finish_reason") or finish
except Exception as exc:
    if CAREFUL:
        sys.exit(f"stream broke: {exc!r}")
print("".join(text))
if CAREFUL and not (done and finish):
    sys.exit("incomplete answer")
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "sixty.jsonl"
    frames = openai_chat_frames(words=52)  # 60 events
    return write_recording(path, "openai", frames)


def client(tmp_path, careful: bool):
    path = tmp_path / ("careful.py" if careful else "careless.py")
    path.write_text(f"CAREFUL = {careful}\n" + textwrap.dedent(CLIENT))
    return [sys.executable, "-S", str(path)]


def sweep(recording, command, *options):
    result = subprocess.run(
        [*STREAMTAP, "sweep", str(recording), "--json", "-", "--timeout", "15", "--jobs", "2", *options, "--", *command],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.mark.slow
def test_a_careless_client_silently_accepts_the_cuts(recording, tmp_path):
    code, report = sweep(recording, client(tmp_path, careful=False), "--positions", "events,protocol")
    source = load_source(recording)
    events = sum(1 for f in source.frames if f.seq is not None)
    runs = report["runs"]
    # a protocol position at an event's end is that event's cut: one run, under both names
    positions = sweep_positions(source, "events,protocol")
    assert len(positions) < events + len(protocol_positions(source))
    assert len(runs) == 2 * len(positions)
    assert report["baseline"]["outcome"] == SILENT  # exit 0 with the whole answer
    # it swallows every cut, clean or abort (it catches what breaks and prints what it has)
    silent = {(r["position"], r["style"]) for r in runs if r["outcome"] == SILENT}
    named = {name for position, _ in silent for name in position.replace(" (", ",").rstrip(")").split(",")}
    for n in range(-1, events - 1):
        for style in ("clean", "abort"):
            assert any(position == f"cut:event={n}" or position.endswith(f"(cut:event={n})")
                       for position, styled in silent if styled == style), (n, style)
    assert {"cut:at=tool-args", "cut:at=before-terminal"} <= named
    assert any(p.startswith("cut:at=before-terminal") and style == "clean" for p, style in silent)
    assert len(silent) == len(runs) == report["counts"][SILENT]
    assert code == 1
    # what the client swallowed, streamtap calls truncated (the cut falls before [DONE])
    assert {r["verdict"] for r in runs} == {"truncated"}
    assert report["baseline"]["verdict"] == "complete"


@pytest.mark.slow
def test_a_careful_client_notices_every_cut(recording, tmp_path):
    code, report = sweep(recording, client(tmp_path, careful=True), "--positions", "events,protocol,bytes=6", "--styles", "clean,abort,reset")
    assert report["baseline"]["outcome"] == SILENT
    outcomes = {(r["position"], r["style"]): r["outcome"] for r in report["runs"]}
    assert set(outcomes.values()) == {NOTICED}, [k for k, v in outcomes.items() if v != NOTICED]
    assert code == 0
    assert all(r["fault_log"] and "cut at byte" in r["fault_log"][0] for r in report["runs"])


def test_a_hanging_client_is_reported_hung(recording, tmp_path):
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(30)\n")
    code, report = sweep(recording, [sys.executable, "-S", str(hang)], "--positions", "event=3", "--styles", "clean", "--timeout", "0.5")
    assert [r["outcome"] for r in report["runs"]] == [HUNG] and code == 1


def test_sweep_positions():
    frames = openai_chat_frames(words=4)
    src = Source.from_frames(frames, wire="sse", dialect="openai-chat")
    events = sweep_positions(src, "events")
    assert events == [f"cut:event={n}" for n in range(-1, len(frames) - 1)]
    starts = {sum(map(len, frames[:i])) for i in range(len(frames) + 1)}
    sampled = sweep_positions(src, "bytes=5")
    offsets = [int(s.split("=")[1]) for s in sampled]
    assert len(offsets) == 5 and offsets == sorted(offsets) and not starts & set(offsets)
    assert sweep_positions(src, "protocol") == ["cut:at=tool-args", "cut:at=escaped-quote", "cut:at=between-blocks", "cut:at=before-terminal"]
    assert sweep_positions(src, "event=2,at=tool-args,event=2") == ["cut:event=2", "cut:at=tool-args"]
    every = sweep_positions(src, f"bytes={10**17}")  # at once: more than the body has is every offset off a frame's end
    assert every == sweep_positions(src, f"bytes={sum(map(len, frames))}")
    assert len(every) == sum(map(len, frames)) - len(frames) and not starts & {int(s.split("=")[1]) for s in every}
    with pytest.raises(FaultSpecError, match="0 or more"):
        sweep_positions(src, "bytes=-1")


def test_classify():
    answer = "The weather in Paris today is mild"
    assert classify(0, answer + "\n", timed_out=False, answer=answer) == SILENT
    assert classify(0, "Error: stream ended early", timed_out=False, answer=answer) == NOTICED
    assert classify(1, answer, timed_out=False, answer=answer) == NOTICED  # printed, then exit 1: noticed
    assert classify(-9, "", timed_out=False) == CRASHED
    assert classify(None, "", timed_out=True) == HUNG
    # exit 0 and the partial answer handed on: an error word beside it does not make it noticed
    assert classify(0, f"{answer}\nerrors: none", timed_out=False, answer=answer) == SILENT
    assert classify(0, f"answer:   {answer.replace(' ', chr(10))}", timed_out=False, answer=answer) == SILENT  # whitespace folded
    # ... nor one inside the answer (a model may write about errors)
    about_errors = "An error budget is the failure rate a service may have"
    assert classify(0, about_errors, timed_out=False, answer=about_errors) == SILENT
    # too short to tell from an error message that quotes it: only the error words count
    assert classify(0, "failed after 'Paris'", timed_out=False, answer="Paris") == NOTICED
    assert classify(0, "", timed_out=False, answer="") == SILENT
    # a user's own pattern: any match in an exit-0 run counts, as the option says
    assert classify(0, f"{answer}\nWARN cut", timed_out=False, error_text="WARN", answer=answer) == NOTICED
    assert classify(0, f"{answer}\nerror", timed_out=False, error_text="WARN", answer=answer) == SILENT


def test_classify_reads_an_answer_printed_escaped_and_an_error_field_that_holds_nothing():
    """A client that prints the SDK's objects (``Response(..., error=None)``) or a JSON result
    (``"error": null``) names an error field that says no error happened: that is no noticing. An
    answer printed as a JSON string or a repr is the answer, escaped."""
    answer = 'The weather in "Paris" is sunny,\nwarm and \u00e9t\u00e9-like today.'
    for printed in (json.dumps({"answer": answer, "error": "boom"}), json.dumps({"answer": answer}, ensure_ascii=False),
                    repr({"answer": answer})):
        assert classify(0, printed, timed_out=False, answer=answer) == SILENT, printed
    for empty in ("Response(id='resp_1', error=None, incomplete_details=None, output=[])", '{"text": "", "error": null}',
                  "error: []\nexception=''"):
        assert classify(0, empty, timed_out=False, answer=answer) == SILENT, empty
    for said in ('error="stream cut"', "Error: None of the chunks came", "Error: null pointer", "status: failed"):
        assert classify(0, said, timed_out=False, answer=answer) == NOTICED, said


def test_a_client_that_never_asks_the_replay_server_is_inconclusive_not_silent(recording):
    """A client reading another variable for its base URL, or answering from a cache, never meets
    the cut: its runs were counted as silent (or noticed), and the uncut one as a success."""
    code, report = sweep(recording, ["true"], "--positions", "event=3,event=10")
    assert report["baseline"]["requested"] is False and report["baseline_failed"] is True
    assert {r["outcome"] for r in report["runs"]} == {INCONCLUSIVE} and code == 1
    said = subprocess.run([*STREAMTAP, "sweep", str(recording), "--positions", "event=3", "--no-progress", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert said.returncode == 1 and "never asked the replay server for the answer" in said.stdout + said.stderr


WORDY = """
import http.client, json, os, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ["STREAMTAP_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
conn.request("POST", "/v1/chat/completions", body=b"{}", headers={"content-type": "application/json"})
text = []
try:
    for line in conn.getresponse():
        line = line.decode().rstrip("\\r\\n")
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice["delta"].get("content") or "")
except Exception:
    pass
if not "".join(text):
    print("error: no answer came")
    sys.exit(0)
print("".join(text))
print("request done, no error")
"""


@pytest.mark.slow
def test_the_default_classification_looks_at_the_answer_not_at_error_words(recording, tmp_path):
    """A careless client that exits 0 and prints the word "error" beside the partial answer is
    silent; one that prints no answer but an error, exit 0, noticed it. --error-text restores
    the plain word match."""
    wordy = tmp_path / "wordy.py"
    wordy.write_text(WORDY)
    command = [sys.executable, "-S", str(wordy)]
    positions = ("--positions", "event=0,event=10,event=30", "--styles", "clean,abort")
    code, report = sweep(recording, command, *positions)
    outcomes = {(r["position"], r["style"]): r["outcome"] for r in report["runs"]}
    assert outcomes[("cut:event=10", "clean")] == outcomes[("cut:event=30", "abort")] == SILENT, outcomes
    assert outcomes[("cut:event=0", "abort")] == outcomes[("cut:event=0", "clean")] == NOTICED, outcomes  # no text: it said so
    assert code == 1
    code, report = sweep(recording, command, *positions, "--error-text", r"\berror\b")
    # the word matches every run, the uncut one too ("no error"): no run shows a cut noticed
    assert report["baseline"]["outcome"] == NOTICED
    assert {r["outcome"] for r in report["runs"]} == {INCONCLUSIVE} and code == 1


def test_sweep_usage_errors(recording):
    for args, message in [
        ([str(recording)], "no client command"),
        ([str(recording), "--styles", "gentle", "--", "true"], "--styles takes"),
        ([str(recording), "--positions", "everywhere", "--", "true"], "--positions takes"),
        (["/nonexistent.jsonl", "--", "true"], "nonexistent"),
        ([str(recording), "--error-text", "(", "--", "true"], "--error-text"),
        ([str(recording), "--json", "/nonexistent/report.json", "--", "true"], "/nonexistent/report.json"),
        ([str(recording), "--", "/nonexistent/client"], "cannot start the client '/nonexistent/client': no such command"),
        ([str(recording), "--", "/proc/version"], "cannot start the client '/proc/version': not an executable file"),
    ]:
        result = subprocess.run([*STREAMTAP, "sweep", *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)


@pytest.mark.parametrize("stop, code", [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_interrupting_a_sweep_stops_the_clients_it_started(recording, tmp_path, stop, code):
    """The clients run in their own session (so a hung one's children die with it): Ctrl-C
    does not reach them, so the sweep must stop them itself."""
    import os
    import signal
    import time

    pids = tmp_path / "pids"
    pids.mkdir()
    hang = tmp_path / "hang.py"
    hang.write_text(f"import os, time\nopen(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\ntime.sleep(60)\n")
    sweep = subprocess.Popen(
        [*STREAMTAP, "sweep", str(recording), "--positions", "event=3", "--styles", "clean", "--timeout", "60", "--", sys.executable, "-S", str(hang)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # a suite started in the background without job control ignores SIGINT, and a child
        # inherits that: this sweep stands for one started at a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 20
        while not list(pids.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = [int(p.name) for p in pids.iterdir()]
        assert started, "the client never started"
        sweep.send_signal(getattr(signal, stop))  # Ctrl-C; timeout, a CI runner or kill; a closed terminal
        _out, err = sweep.communicate(timeout=20)
        assert sweep.returncode == code and "Traceback" not in err, (sweep.returncode, err)
    finally:
        sweep.kill()
        sweep.wait(10)
    time.sleep(0.2)
    alive = []
    for pid in started:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"clients still running after the sweep was interrupted: {alive}"
